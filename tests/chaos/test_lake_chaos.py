"""The Delta and Iceberg sinks under chaos: the driver SIGKILLed again and again, at least once
inside a sink's write (asleep at the ``lake_commit`` failpoint: data files being written, nothing
committed), then restarted on the same store. The table, read with its own library and with
Spark alone (the files its log lists), holds every record exactly once.

CI kills neither here: the Delta sink is killed inside its write in CI by test_kafka_chaos, and
Iceberg's retried and superseded writes are tested in tests/unit/lake on both stores; ``scripts/test
--long tests/chaos`` runs two and five kills of each sink, five in each mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from headrace.lake import batches_of
from headrace.lake.iceberg import catalog_of
from headrace.names import lake_app_id

from ..ci import long_only
from .test_sink_chaos import SinkMonkey, check_exactly_once, sink_drained


def delta_chaos(spark: Any, tmp_path: Path, kills: int, mode: str, n: int, timeout_s: float) -> None:
    root = str(tmp_path / "delta")
    store_url = f"sqlite:///{tmp_path}/store.db"
    monkey = SinkMonkey(tmp_path, store_url, n, mode, ["delta", root], seed=kills, step="lake_commit")
    monkey.run(kills, timeout_s)
    assert sink_drained(store_url)
    table = DeltaTable(root)
    got = table.to_pyarrow_table(columns=["n", "id"]).to_pylist()
    check_exactly_once([(r["n"], r["id"]) for r in got], n)
    rows = spark.read.option("basePath", root).parquet(*table.file_uris()).select("n", "id").collect()
    check_exactly_once([(r.n, r.id) for r in rows], n)
    # each producer's application transaction is the last of its batches the table holds
    last = batches_of(table.to_pyarrow_table(columns=["producer", "batch"]))
    assert last and {p: table.transaction_version(lake_app_id("stamped-delta", p)) for p in last} == last


def iceberg_chaos(spark: Any, store_url: str, tmp_path: Path, kills: int, mode: str, n: int, timeout_s: float) -> None:
    warehouse = str(tmp_path / "warehouse")
    monkey = SinkMonkey(tmp_path, store_url, n, mode, ["iceberg", "lake.stamped", warehouse], seed=kills,
                        step="lake_commit")
    monkey.run(kills, timeout_s)
    table = catalog_of(store_url, warehouse).load_table("lake.stamped")
    got = table.scan(selected_fields=("n", "id")).to_arrow().to_pylist()
    check_exactly_once([(r["n"], r["id"]) for r in got], n)
    paths = [task.file.file_path for task in table.scan().plan_files()]
    check_exactly_once([(r.n, r.id) for r in spark.read.parquet(*paths).select("n", "id").collect()], n)


def test_a_delta_sink_holds_every_record_once_after_two_kills(spark: Any, tmp_path: Path) -> None:
    long_only("the Delta sink's short chaos", covered_by="the Kafka chaos, whose Delta sink is killed inside its "
              "write and read back with deltalake and with Spark alone")
    delta_chaos(spark, tmp_path, kills=2, mode="continuous", n=1_500, timeout_s=300)


def test_an_iceberg_sink_holds_every_record_once_after_two_kills(spark: Any, postgres_server: Any,
                                                                 tmp_path: Path) -> None:
    long_only("the Iceberg sink's short chaos", covered_by="the Kafka chaos, whose Delta sink is killed inside its "
              "write (the lake sinks share lake/base.py's commit), and tests/unit/lake's retried batch written once "
              "and superseded writer refused, for Iceberg on both stores")
    iceberg_chaos(spark, postgres_server.new_database(), tmp_path, kills=2, mode="microbatch", n=1_500,
                  timeout_s=300)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["microbatch", "continuous"])
def test_a_delta_sink_holds_every_record_once_after_five_kills(spark: Any, tmp_path: Path, mode: str) -> None:
    delta_chaos(spark, tmp_path, kills=5, mode=mode, n=6_000, timeout_s=900)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["microbatch", "continuous"])
def test_an_iceberg_sink_holds_every_record_once_after_five_kills(spark: Any, each_store: str, tmp_path: Path,
                                                                  mode: str) -> None:
    iceberg_chaos(spark, each_store, tmp_path, kills=5, mode=mode, n=6_000, timeout_s=900)
