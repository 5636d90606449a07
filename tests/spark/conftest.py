from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def store_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path}/store.db"



@pytest.fixture(params=["microbatch", "continuous"])
def mode(request: pytest.FixtureRequest) -> str:
    """Each execution mode in turn: a Spark query per computation, then long-lived workers."""
    return str(request.param)
