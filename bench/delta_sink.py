"""Throughput of keyed count -> Delta on the machine's 2 cores: how much the Delta sink costs a
topology, against the same topology without a sink and with Spark's own Parquet file sink, all in
the same run and SparkSession.

    .venv/bin/python bench/delta_sink.py                 # 200,000 records over 10,000 keys, both modes
    .venv/bin/python bench/delta_sink.py --quick         # 20,000 over 1,000, continuous mode only

The work: ``Count`` (a per-key count in keyed state) produces each key's new count for every
record to the typed stream ``counts`` (``word STRING, count BIGINT``); the sink, if any, writes
that stream. The input is published to the bus first (untimed, as bench/spark_keyed_count.py
does); the clock runs from ``run`` until it returns, which is once the computation has drained
and every sink has written everything journaled. Each variant's output is checked after the
clock: the Delta table (read with deltalake) and the Parquet files (read with Spark) hold one row
per record, and each key's highest count equals a plain-Python Counter of the input.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from headrace import Computation, Topology, injectors, key_by, run
from headrace.spark.session import spark_session


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"word": ctx.key, "count": ctx.state})


def records(n: int, keys: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"key": f"key-{rng.randrange(keys)}", "ts": 1_000_000 + i} for i in range(n)]


def topology(data: list[dict[str, Any]], batch: int, shards: int, sink: str, folder: str) -> Topology:
    t = Topology("keyed_count_sink")
    t.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    t.add(Count, inputs={"events": key_by("key")}, outputs=["counts"], shards=shards)
    t.stream("counts", schema="word STRING, count BIGINT")
    if sink == "delta":
        t.sink("counts", delta=os.path.join(folder, "delta"))
    elif sink == "parquet":
        t.sink("counts", format="parquet", path=os.path.join(folder, "parquet"))
    return t


def measure(spark: Any, data: list[dict[str, Any]], batch: int, shards: int, sink: str, mode: str) -> float:
    folder = tempfile.mkdtemp(prefix=f"headrace-delta-bench-{sink}-")
    url = f"sqlite:///{folder}/store.db"
    bus = Topology("keyed_count_bus")
    bus.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    run(bus, store=url, spark=spark, progress=None)
    options = {"trigger_ms": 100} if mode == "microbatch" else {}
    start = time.perf_counter()
    run(topology(data, batch, shards, sink, folder), store=url, spark=spark, progress=None, mode=mode, **options)
    elapsed = time.perf_counter() - start
    check(spark, data, sink, folder)
    return elapsed


def check(spark: Any, data: list[dict[str, Any]], sink: str, folder: str) -> None:
    if sink == "none":
        return
    if sink == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(os.path.join(folder, "delta")).to_pyarrow_table(columns=["word", "count"]).to_pylist()
        got = [(r["word"], r["count"]) for r in rows]
    else:
        got = [(r.value.word, r.value["count"]) for r in spark.read.parquet(os.path.join(folder, "parquet")).collect()]
    highest: dict[str, int] = {}
    for key, count in got:
        highest[key] = max(highest.get(key, 0), count)
    expected = Counter(r["key"] for r in data)
    if len(got) != len(data) or highest != expected:
        sys.exit(f"{sink}: {len(got)} rows for {len(data)} records, counts equal: {highest == expected}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--modes", default="continuous,microbatch")
    parser.add_argument("--quick", action="store_true", help="20,000 records over 1,000 keys, continuous mode")
    args = parser.parse_args()
    if args.quick:
        args.records, args.keys, args.batch, args.modes = 20_000, 1_000, 5_000, "continuous"
    data = records(args.records, args.keys)
    spark = spark_session(args.master, conf={"spark.sql.shuffle.partitions": str(args.shards)}, ui=False)
    print(f"keyed count -> sink: {args.records:,} records over {args.keys:,} keys, {args.shards} shards, "
          f"{args.master} on {os.cpu_count()} cores ({platform.machine()}), SQLite store")
    for mode in args.modes.split(","):
        small = records(2_000, 100, seed=1)
        for sink in ("none", "parquet", "delta"):  # warm-up: the session, the Python workers, the libraries
            measure(spark, small, 1_000, args.shards, sink, mode)
        seconds = {sink: measure(spark, data, args.batch, args.shards, sink, mode) for sink in ("none", "parquet", "delta")}
        print(f"\n{mode} mode")
        print(f"{'sink':<10} {'seconds':>8} {'records/s':>10} {'vs no sink':>11}")
        for sink, s in seconds.items():
            print(f"{sink:<10} {s:>8.2f} {args.records / s:>10,.0f} {seconds['none'] / s:>10.2f}x")
        print(f"delta vs Spark's parquet file sink: {seconds['parquet'] / seconds['delta']:.2f}x")


if __name__ == "__main__":
    main()
