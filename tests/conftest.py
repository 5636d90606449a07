"""Fixtures every test package may use: a real PostgreSQL server, started once per session on demand."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from .kafka_broker import KafkaBroker
from .postgres_server import PostgresServer


# PostgreSQL tests need a server: HEADRACE_TEST_POSTGRES=postgresql://…/postgres names a running one,
# otherwise one is started from the machine's binaries (scripts/test installs them through
# scripts/ensure-postgres). A server that cannot start fails those tests, unless
# HEADRACE_SKIP_POSTGRES=1 is set: then they are skipped, with the reason.
SKIP_POSTGRES = "HEADRACE_SKIP_POSTGRES"

# Test packages whose every test starts a local SparkSession (the JVM), and the README, whose
# example runs a topology on Spark: marked `spark`, so `-m "not spark"` selects the quick tests.
SPARK_PACKAGES = ("spark", "chaos", "cluster", "netbed")
SPARK_DOCS = ("README.md",)



@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (one JVM) for the whole test session."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from headrace.spark.session import spark_session

    session = spark_session("local[2]", app_name="headrace-tests", conf={"spark.ui.port": "0"})  # any free port
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for this session (or ``HEADRACE_TEST_POSTGRES``'s)."""
    server = PostgresServer(os.environ.get("HEADRACE_TEST_POSTGRES"))
    why_not = _start(server)
    if why_not is not None and os.environ.get(SKIP_POSTGRES) == "1":
        pytest.skip(f"{SKIP_POSTGRES}=1 and PostgreSQL could not start: {why_not}")
    if why_not is not None:
        pytest.fail(f"PostgreSQL could not start for the store tests: {why_not}\n"
                    "Hint: install the server with `apt-get install -y postgresql` (scripts/test does it when it "
                    f"may), or set {SKIP_POSTGRES}=1 to skip the PostgreSQL tests", pytrace=False)
    yield server
    server.stop()


def _start(server: PostgresServer) -> str | None:
    """Start the server; why it could not start, if it could not."""
    try:
        server.start()
    except RuntimeError as e:
        return str(e)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    docs = {tests.parent / name for name in SPARK_DOCS}
    for item in items:
        in_package = item.path.is_relative_to(tests) and item.path.relative_to(tests).parts[0] in SPARK_PACKAGES
        if in_package or item.path in docs:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(params=["sqlite", "postgresql"])
def each_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on each backing store in turn: a SQLite file, then a fresh database on the
    session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("postgres_server").new_database()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A real Apache Kafka broker (KRaft, one node on 127.0.0.1) for this session, started from the
    jars scripts/ensure-kafka caches (or ``HEADRACE_TEST_KAFKA``'s, already running)."""
    broker = KafkaBroker(os.environ.get("HEADRACE_TEST_KAFKA"))
    try:
        broker.start()
    except (RuntimeError, OSError) as e:
        pytest.fail(f"the Kafka broker could not start: {e}\n"
                    "Hint: scripts/ensure-kafka fetches its jars (needs Java 17+ and Maven)", pytrace=False)
    yield broker
    broker.stop()
