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


def start_runner(topology: Any, store_url: str, spark: Any, mode: str) -> Any:
    """A started runner of ``topology`` in ``mode``, for tests that add or remove computations while it runs."""
    from headrace.spark.continuous import ContinuousRunner
    from headrace.spark.runner import SparkRunner

    if mode == "continuous":
        return ContinuousRunner(topology, store_url, spark=spark, progress=None).start()
    return SparkRunner(topology, store_url, spark=spark, trigger_ms=100).start()
