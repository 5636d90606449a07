"""Zeitgeist's WindowCounter stage (one-second buckets per query, watermark timers) on Spark:
headrace against transformWithState with event-time timers, same input, same run.

    .venv/bin/python bench/window_counter.py [--records 500000] [--keys 5000] [--batch 50000]

Variants, each checked against a plain-Python count of the input:
1. transformWithState (Row API, RocksDB state store, timeMode EventTime, a MapState of bucket
   counts and a timer per bucket), over a file stream with ``withWatermark(…, "0 seconds")``;
   Spark's watermark stops at the largest event time seen, so the last buckets never fire: the
   check covers the buckets it emitted, and they must be exact;
2. headrace (exactly-once, strong productions, SQLite store): every bucket fires;
3. the same Computation in a bare in-memory loop: state in a dict, timers in a heap, fired when
   the batch's watermark (its smallest timestamp still to come) passes them.
"""

from __future__ import annotations

import argparse
import heapq
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Iterator

sys.path.insert(0, os.path.dirname(__file__))

from spark_keyed_count import write_files  # noqa: E402

from headrace import Computation, Topology, injectors, key_by, read, run  # noqa: E402
from headrace.spark.session import spark_session  # noqa: E402

BUCKET = 1_000


def records(n: int, keys: int, seed: int = 7) -> list[dict[str, Any]]:
    """Zipf-like query popularity; timestamps 1 ms apart with up to 200 ms of disorder."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(keys)]
    names = rng.choices([f"q{k}" for k in range(keys)], weights=weights, k=n)
    return [{"key": names[i], "ts": 1_000_000 + i - rng.randrange(200)} for i in range(n)]


class WindowCounter(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        bucket = record.timestamp - record.timestamp % BUCKET
        counts = ctx.state or {}
        if bucket not in counts:
            counts[bucket] = 0
            ctx.set_timer(str(bucket), bucket + BUCKET)
        counts[bucket] += 1
        ctx.state = counts

    def process_timer(self, ctx: Any, timer: Any) -> None:
        counts = ctx.state
        bucket = int(timer.tag)
        ctx.produce("windows", {"query": ctx.key, "bucket": bucket, "count": counts.pop(bucket)}, timestamp=bucket)
        ctx.state = counts


def oracle(data: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    return dict(Counter((r["key"], r["ts"] - r["ts"] % BUCKET) for r in data))


def run_bare(data: list[dict[str, Any]], batch: int) -> tuple[float, dict[tuple[str, int], int]]:
    start = time.perf_counter()
    state: dict[str, dict[int, int]] = {}
    timers: list[tuple[int, str, int]] = []
    out: dict[tuple[str, int], int] = {}
    for i in range(0, len(data), batch):
        for r in data[i:i + batch]:
            ts, key = r["ts"], r["key"]
            bucket = ts - ts % BUCKET
            counts = state.setdefault(key, {})
            if bucket not in counts:
                counts[bucket] = 0
                heapq.heappush(timers, (bucket + BUCKET, key, bucket))
            counts[bucket] += 1
        rest = data[i + batch:]
        watermark = min(r["ts"] for r in rest) if rest else 2**62
        while timers and timers[0][0] <= watermark:
            _, key, bucket = heapq.heappop(timers)
            out[(key, bucket)] = state[key].pop(bucket)
    return time.perf_counter() - start, out


def run_headrace(spark: Any, data: list[dict[str, Any]], folder: str, batch: int) -> tuple[float, dict[tuple[str, int], int]]:
    url = f"sqlite:///{folder}/store.db"
    bus = Topology("window_counter")
    bus.inject("searches", injectors.records(data, timestamp="ts", batch_size=batch))
    run(bus, store=url, spark=spark, progress=None, mode="microbatch")  # the input on the bus first, untimed
    t = Topology("window_counter")
    t.inject("searches", injectors.records(data, timestamp="ts", batch_size=batch))
    t.add(WindowCounter, inputs={"searches": key_by("key")}, outputs=["windows"])
    start = time.perf_counter()
    run(t, store=url, spark=spark, progress=None, trigger_ms=50, mode="microbatch")
    elapsed = time.perf_counter() - start
    return elapsed, {(r.value["query"], r.value["bucket"]): r.value["count"] for r in read("windows", url)}


def run_transform_with_state(spark: Any, folder: str, checkpoint: str) -> tuple[float, dict[tuple[str, int], int]]:
    from pyspark.sql import Row
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class WindowProcessor(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.counts = handle.getMapState("counts", "bucket LONG", "count LONG")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            local: dict[int, int] = {}
            for r in rows:
                bucket = r["ts"] - r["ts"] % BUCKET
                local[bucket] = local.get(bucket, 0) + 1
            for bucket, n in local.items():
                if self.counts.containsKey((bucket,)):
                    stored = self.counts.getValue((bucket,))
                    assert stored is not None
                    n += stored[0]
                else:
                    self.handle.registerTimer(bucket + BUCKET)
                self.counts.updateValue((bucket,), (n,))
            return iter([])

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            bucket = expiredTimerInfo.getExpiryTimeInMs() - BUCKET
            stored = self.counts.getValue((bucket,))
            assert stored is not None, "a bucket's timer is registered with its count"
            count = stored[0]
            self.counts.removeKey((bucket,))
            yield Row(query=key[0], bucket=bucket, count=count)

        def close(self) -> None:
            pass

    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    stream = (spark.readStream.schema("key STRING, ts BIGINT").option("maxFilesPerTrigger", 1).parquet(folder)
              .withColumn("event_time", F.timestamp_millis("ts")).withWatermark("event_time", "0 seconds"))
    windows = stream.groupBy("key").transformWithState(WindowProcessor(), "query STRING, bucket LONG, count LONG",
                                                       "Append", "EventTime")
    out: dict[tuple[str, int], int] = {}

    def keep(df: Any, batch_id: int) -> None:
        for row in df.collect():
            assert (row["query"], row["bucket"]) not in out, "a window fired twice"
            out[(row["query"], row["bucket"])] = row["count"]

    start = time.perf_counter()
    query = (windows.writeStream.foreachBatch(keep).outputMode("append").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--skip-tws", action="store_true")
    args = parser.parse_args()
    data = records(args.records, args.keys)
    expected = oracle(data)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, Spark {args.master}")
    print(f"workload: WindowCounter, {args.records:,} records over {args.keys:,} queries (Zipf-like), "
          f"{len(expected):,} one-second windows, batches of {args.batch:,}")
    spark = spark_session(args.master, conf={"spark.sql.shuffle.partitions": "4"})
    rows = []
    with tempfile.TemporaryDirectory(prefix="headrace-window-bench-") as tmp:
        run_headrace(spark, data[:5_000], os.path.join(tmp, "warm"), 1_000)  # warm up the JVM and workers
        bare_s, bare_out = run_bare(data, args.batch)
        assert bare_out == expected, "the bare loop's windows differ from the oracle"
        rows.append(("bare in-memory loop", args.records / bare_s, len(bare_out)))
        hr_s, hr_out = run_headrace(spark, data, os.path.join(tmp, "headrace"), args.batch)
        assert hr_out == expected, "headrace's windows differ from the oracle"
        rows.append(("headrace (exactly-once, strong productions, SQLite)", args.records / hr_s, len(hr_out)))
        if not args.skip_tws:
            files = os.path.join(tmp, "files")
            os.makedirs(files)
            write_files(data, files, args.batch)
            tws_s, tws_out = run_transform_with_state(spark, files, os.path.join(tmp, "tws-checkpoint"))
            assert all(expected[w] == n for w, n in tws_out.items()), "transformWithState's windows are wrong"
            rows.append(("transformWithState (Row API, RocksDB, event-time timers)", args.records / tws_s, len(tws_out)))
    headrace_rate = rows[1][1]
    print(f"{'variant':<58} {'records/s':>10} {'windows':>8} {'headrace is':>12}")
    for label, rate, fired in rows:
        print(f"{label:<58} {rate:>10,.0f} {fired:>8,} {headrace_rate / rate:>11.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
