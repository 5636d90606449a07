from __future__ import annotations

import os
import sys
from typing import Any, Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (one JVM) for the whole test session."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from headrace.spark.session import spark_session

    session = spark_session("local[2]", app_name="headrace-tests")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


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
