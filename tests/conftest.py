"""Fixtures every test package may use: a real PostgreSQL server, started once per session on demand."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from .postgres_server import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for this session (or ``HEADRACE_TEST_POSTGRES``'s). Missing binaries fail
    the test under CI, which installs them, and skip it elsewhere with the command that installs them."""
    server = PostgresServer(os.environ.get("HEADRACE_TEST_POSTGRES"))
    try:
        server.start()
    except RuntimeError as e:
        if os.environ.get("CI"):
            pytest.fail(str(e))
        pytest.skip(str(e))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def each_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on each backing store in turn: a SQLite file, then a fresh database on the
    session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("postgres_server").new_database()
