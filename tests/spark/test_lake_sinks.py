"""The Delta and Iceberg sinks on Spark, in both execution modes: the tables hold every record of
the stream once (the oracle: ``read`` of the store), read back with deltalake and pyiceberg and
with Spark alone (no Delta or Iceberg jars: the data files the table's log lists), and a second
run on the same store commits nothing new."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from headrace import Computation, Topology, injectors, key_by, read, run
from headrace.lake.iceberg import catalog_of

N = 150


class Stamp(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("stamped", {"user": ctx.key, "n": record.value["n"]})


def build(tmp: Path) -> Topology:
    t = Topology("lake")
    t.inject("events", injectors.records([{"user": f"u{i % 6}", "n": i, "ts": 1_000 + i} for i in range(N)],
                                         timestamp="ts", batch_size=25, rate=100))
    t.add(Stamp, inputs={"events": key_by("user")}, outputs=["stamped"], shards=2)
    t.stream("stamped", schema="user STRING, n BIGINT")
    t.sink("stamped", delta=str(tmp / "delta"))
    t.sink("stamped", iceberg="lake.stamped", warehouse=str(tmp / "warehouse"))
    return t


def spark_reads_iceberg_files(spark: Any, table: Any) -> Any:
    """Spark without Iceberg's jars: the data files of the current snapshot, as Parquet."""
    paths = [task.file.file_path for task in table.scan().plan_files()]
    return spark.read.parquet(*paths)


def test_delta_and_iceberg_sinks_hold_every_record_once(spark: Any, store_url: str, mode: str, tmp_path: Path) -> None:
    run(build(tmp_path), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    oracle = sorted((r.id, r.value["user"], r.value["n"]) for r in read("stamped", store_url))
    assert len(oracle) == N

    delta = DeltaTable(str(tmp_path / "delta"))
    got = delta.to_pyarrow_table(columns=["id", "user", "n"]).to_pylist()
    assert sorted((r["id"], r["user"], r["n"]) for r in got) == oracle
    root = str(tmp_path / "delta")
    rows = spark.read.option("basePath", root).parquet(*delta.file_uris()).select("id", "user", "n").collect()
    assert sorted((r.id, r.user, r.n) for r in rows) == oracle

    table = catalog_of(store_url, str(tmp_path / "warehouse")).load_table("lake.stamped")
    got = table.scan(selected_fields=("id", "user", "n")).to_arrow().to_pylist()
    assert sorted((r["id"], r["user"], r["n"]) for r in got) == oracle
    rows = spark_reads_iceberg_files(spark, table).select("id", "user", "n").collect()
    assert sorted((r.id, r.user, r.n) for r in rows) == oracle

    version, snapshot = delta.version(), table.current_snapshot()
    run(build(tmp_path), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    assert DeltaTable(root).version() == version, "a second run commits no Delta version"
    again = catalog_of(store_url, str(tmp_path / "warehouse")).load_table("lake.stamped")
    assert again.current_snapshot().snapshot_id == snapshot.snapshot_id, "nor an Iceberg snapshot"
