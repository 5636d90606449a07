"""Keyed counting on Spark: headrace against Spark's own transformWithState, same input, same run.

    .venv/bin/python bench/spark_keyed_count.py                 # 500,000 records over 50,000 keys
    .venv/bin/python bench/spark_keyed_count.py --keys 5000,50000,500000   # key scaling, one run
    .venv/bin/python bench/spark_keyed_count.py --quick         # 50,000 over 5,000, for a smoke run

Variants, each checked against a plain-Python Counter of the input:
1. transformWithState (Row API, ValueState per key, RocksDB state store) over a file stream,
   ``maxFilesPerTrigger=1`` so it sees the same 50,000-record batches headrace does;
2. headrace (exactly-once, strong productions, SQLite store), ``headrace.run`` to drain, its
   per-key state read back from the store; its input is published to the bus before the clock
   starts, as the Spark variant's files are written before its clock starts;
3. headrace with both off (at-least-once, weak productions);
4. the same Computation in a bare in-memory loop (bench/engine_throughput.py).
Both Spark variants share one warmed-up SparkSession; session start-up is excluded from both.
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Iterator

sys.path.insert(0, os.path.dirname(__file__))

from engine_throughput import KeyedCounter, make_input, run_bare  # noqa: E402

from headrace import Computation, Topology, injectors, key_by, run  # noqa: E402
from headrace.spark.session import spark_session  # noqa: E402
from headrace.store import open_store  # noqa: E402


def records(n: int, keys: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"key": f"key-{rng.randrange(keys)}", "ts": 1_000_000 + i} for i in range(n)]


def write_files(data: list[dict[str, Any]], folder: str, batch: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(0, len(data), batch):
        chunk = data[i:i + batch]
        pq.write_table(pa.table({"key": [r["key"] for r in chunk], "ts": [r["ts"] for r in chunk]}),
                       os.path.join(folder, f"part-{i // batch:05d}.parquet"))


def run_transform_with_state(spark: Any, folder: str, checkpoint: str) -> tuple[float, dict[str, int]]:
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.types import LongType, StructField, StructType

    state_schema = StructType([StructField("count", LongType(), True)])

    class CountProcessor(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", state_schema)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            n = sum(1 for _ in rows)
            total = (self.count.get()[0] if self.count.exists() else 0) + n
            self.count.update((total,))
            yield Row(key=key[0], count=total)

        def close(self) -> None:
            pass

    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    stream = spark.readStream.schema("key STRING, ts BIGINT").option("maxFilesPerTrigger", 1).parquet(folder)
    counted = stream.groupBy("key").transformWithState(CountProcessor(), "key STRING, count LONG", "Update", "None")
    totals: dict[str, int] = {}

    def keep(df: Any, batch_id: int) -> None:
        for row in df.collect():
            totals[row["key"]] = max(totals.get(row["key"], 0), row["count"])

    start = time.perf_counter()
    query = (counted.writeStream.foreachBatch(keep).outputMode("update").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return time.perf_counter() - start, totals


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def run_headrace(spark: Any, data: list[dict[str, Any]], folder: str, batch: int, shards: int,
                 **options: Any) -> tuple[float, dict[str, int]]:
    """Publishes the input to the bus first (untimed, as the files of the Spark variant are written
    before it starts), then times the computation from its start until it has drained."""
    url = f"sqlite:///{folder}/store.db"
    bus = Topology("keyed_count")
    bus.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    run(bus, store=url, spark=spark, progress=None)
    t = Topology("keyed_count")
    t.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    t.add(Count, inputs={"events": key_by("key")}, shards=shards, **options)
    start = time.perf_counter()
    run(t, store=url, spark=spark, progress=None, trigger_ms=50)
    elapsed = time.perf_counter() - start
    store = open_store(url)
    keys = {r["key"] for r in data}
    return elapsed, {k: pickle.loads(store.state("Count", k)) for k in keys}


def warm_up(spark: Any, folder: str) -> None:
    run_headrace(spark, records(2_000, 100), folder, 1_000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", default="50000", help="key counts, comma-separated: one table row each")
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--quick", action="store_true", help="50,000 records over 5,000 keys")
    parser.add_argument("--skip-tws", action="store_true", help="no transformWithState variant")
    parser.add_argument("--skip-weak", action="store_true", help="no at-least-once variant")
    args = parser.parse_args()
    if args.quick:
        args.records, args.keys, args.batch = 50_000, "5000", 10_000
    key_counts = [int(k) for k in args.keys.split(",")]

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"Spark {args.master}")
    print(f"workload: keyed count, {args.records:,} records, batches of {args.batch:,}, {args.shards} shards")
    spark = spark_session(args.master, conf={"spark.sql.shuffle.partitions": str(args.shards)})
    table = []
    with tempfile.TemporaryDirectory(prefix="headrace-spark-bench-") as tmp:
        warm_up(spark, os.path.join(tmp, "warm"))
        for keys in key_counts:
            table.append((keys, measure(spark, args, keys, os.path.join(tmp, f"k{keys}"))))
    print()
    print(f"{'keys':>8} {'variant':<52} {'records/s':>10} {'headrace is':>12}")
    for keys, rows in table:
        headrace_rate = rows[1][1]
        for label, rate in rows:
            print(f"{keys:>8,} {label:<52} {rate:>10,.0f} {headrace_rate / rate:>11.2f}x")
    print(f"peak memory of the Python driver: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    spark.stop()


def measure(spark: Any, args: Any, keys: int, tmp: str) -> list[tuple[str, float]]:
    data = records(args.records, keys)
    oracle = dict(Counter(r["key"] for r in data))
    rows = []
    bare_s, _ = run_bare(make_input(args.records, keys))
    hr_s, hr_counts = run_headrace(spark, data, os.path.join(tmp, "strong"), args.batch, args.shards)
    assert hr_counts == oracle, "headrace counts differ from the oracle"
    rows.append(("bare in-memory loop", args.records / bare_s))
    rows.append(("headrace (exactly-once, strong productions, SQLite)", args.records / hr_s))
    if not args.skip_weak:
        weak_s, weak_counts = run_headrace(spark, data, os.path.join(tmp, "weak"), args.batch, args.shards,
                                           semantics="at_least_once", productions="weak")
        assert weak_counts == oracle, "headrace (at-least-once) counts differ from the oracle"
        rows.append(("headrace (at-least-once, weak productions, SQLite)", args.records / weak_s))
    if not args.skip_tws:
        files = os.path.join(tmp, "files")
        os.makedirs(files)
        write_files(data, files, args.batch)
        tws_s, tws_counts = run_transform_with_state(spark, files, os.path.join(tmp, "tws-checkpoint"))
        assert tws_counts == oracle, "transformWithState counts differ from the oracle"
        rows.append(("transformWithState (Row API, RocksDB)", args.records / tws_s))
    for label, rate in rows:
        print(f"  {keys:,} keys: {label}: {rate:,.0f} records/s", flush=True)
    return rows


if __name__ == "__main__":
    main()
