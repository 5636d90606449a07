"""Keyed counting on Spark: headrace against Spark's own transformWithState, same input, same run.

    .venv/bin/python bench/spark_keyed_count.py                 # 500,000 records over 50,000 keys
    .venv/bin/python bench/spark_keyed_count.py --keys 5000,50000,500000   # key scaling, one run
    .venv/bin/python bench/spark_keyed_count.py --quick         # 50,000 over 5,000, for a smoke run

The equal work, for every variant that runs on Spark:
- the same input, landed before the clock starts: headrace's injector publishes it to the bus,
  the Spark variant's parquet files are written (one per ``--batch`` records); both with the same
  schema (``SCHEMA``: headrace's stream is typed, so a reader keys it from its field column);
- drained as one micro-batch: headrace's source reads every batch published since its last offset,
  so a pre-published input is a single micro-batch; Spark's file source reads every file present
  (no ``maxFilesPerTrigger``). headrace in continuous mode has no micro-batches: each key interval
  reads everything on the bus in its worker's first pass and commits it as one batch (journaled as
  producer ``Count/<i>``). Each key's state is therefore read and written once. The number of
  micro-batches that saw input (for continuous mode: the most batches any interval committed) is
  counted for each variant and must be the same;
- a count per key in keyed state, and no output rows: headrace's ``Count`` sets ``ctx.state`` and
  produces nothing; the StatefulProcessor updates a ValueState and yields nothing, into Spark's
  ``noop`` sink. The result of each is its state, committed by the engine to its own durable store
  inside the clock (headrace: one SQLite transaction per shard; Spark: the RocksDB state store
  and its checkpoint) and read back after the clock stops by the engine's own reader: headrace's
  ``store.state`` decoded with the computation's codec, Spark's state data source
  (``spark.read.format("statestore")``). Both must equal a plain-Python Counter of the input.

Variants:
1. transformWithState (Row API, ValueState per key, RocksDB state store) over a file stream;
2. headrace (exactly-once, strong productions, SQLite store), ``headrace.run`` to drain, in
   micro-batch mode (a Structured Streaming query, a task per shard);
3. the same in continuous mode (``mode="continuous"``: long-lived workers, one per core, each
   owning key intervals; the clock runs from ``run`` until it returns, as for 2);
4. headrace micro-batch with both off (at-least-once, weak productions; with no productions, only
   the missing dedup of record ids differs);
5. the same Computation in a bare in-memory loop (bench/engine_throughput.py).
Every Spark variant shares one SparkSession, warmed up by a small run of each; session start-up is
excluded from all.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Iterator, NamedTuple

sys.path.insert(0, os.path.dirname(__file__))

from engine_throughput import make_input, run_bare  # noqa: E402

from headrace import Computation, Topology, injectors, key_by, run  # noqa: E402
from headrace.monitor.events import fenced_events  # noqa: E402
from headrace.spark.session import spark_session  # noqa: E402
from headrace.store import open_store  # noqa: E402


SCHEMA = "key STRING, ts BIGINT"  # the input's, for headrace's stream as for Spark's file stream


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


class Measured(NamedTuple):
    """One variant's run: seconds on the clock, its per-key counts read back from its state after
    the clock stopped, how many micro-batches saw input, and how many input rows it processed;
    in continuous mode, when each interval's commit was journaled (seconds after the clock started)."""

    seconds: float
    counts: dict[str, int]
    batches: int
    rows: int
    commits_at: tuple[float, ...] = ()
    fenced: tuple[str, ...] = ()  # continuous mode: intervals a worker lost to another (its commit refused), and when


def run_transform_with_state(spark: Any, folder: str, checkpoint: str) -> Measured:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.types import LongType, StructField, StructType

    state_schema = StructType([StructField("count", LongType(), True)])

    class CountProcessor(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", state_schema)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            n = sum(1 for _ in rows)
            if self.count.exists():
                stored = self.count.get()
                assert stored is not None
                n += stored[0]
            self.count.update((n,))
            return iter(())  # no output rows: the count lives in the state, as headrace's does

        def close(self) -> None:
            pass

    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    # no maxFilesPerTrigger: every file present is one micro-batch, as headrace's source reads
    # every batch already on the bus in one
    stream = spark.readStream.schema(SCHEMA).parquet(folder)
    counted = stream.groupBy("key").transformWithState(CountProcessor(), "key STRING, count LONG", "Update", "None")
    start = time.perf_counter()
    query = (counted.writeStream.format("noop").outputMode("update").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    inputs = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    state = spark.read.format("statestore").option("stateVarName", "count").load(checkpoint)
    counts = {row["key"]["key"]: row["value"]["count"] for row in state.select("key", "value").collect()}
    return Measured(elapsed, counts, len(inputs), sum(inputs))


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def run_headrace(spark: Any, data: list[dict[str, Any]], folder: str, batch: int, shards: int,
                 mode: str = "microbatch", **options: Any) -> Measured:
    """Publishes the input to the bus first (untimed, as the files of the Spark variant are written
    before it starts), then times the computation from its start until it has drained."""
    url = f"sqlite:///{folder}/store.db"
    # the same topology without its computation, in the same mode: a store's stream belongs to one
    # topology (monitor/owners.py), which keeps one mode
    bus = Topology("keyed_count")
    bus.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    bus.stream("events", schema=SCHEMA)
    run(bus, store=url, spark=spark, progress=None, mode=mode)
    t = Topology("keyed_count")
    t.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    t.stream("events", schema=SCHEMA)
    spec = t.add(Count, inputs={"events": key_by("key")}, shards=shards, **options)
    start, started_ms = time.perf_counter(), time.time() * 1000
    run(t, store=url, spark=spark, progress=None, mode=mode, trigger_ms=50 if mode == "microbatch" else None)
    elapsed = time.perf_counter() - start
    store = open_store(url)
    try:
        counts = {}
        for key in {r["key"] for r in data}:
            raw = store.state(spec.name, key)
            if raw is not None:
                counts[key] = spec.options.codec.decode(raw)
        # the store has no call that lists keys: count its state rows, so that a key outside the
        # input would show as well
        db = sqlite3.connect(f"file:{folder}/store.db?mode=ro", uri=True)
        try:
            stored = db.execute("SELECT count(*) FROM state WHERE computation = ?", (spec.name,)).fetchone()[0]
        finally:
            db.close()
        if stored != len(counts):
            counts["<state rows of other keys>"] = stored - len(counts)
        commits_at: tuple[float, ...] = ()
        lost: tuple[str, ...] = ()
        if mode == "continuous":  # an interval's commits are batches of its producer Count/<i>
            journal = [store.batches(f"{spec.name}/{i}") for i in range(shards)]
            batches = max(len(b) for b in journal)
            commits_at = tuple((b.completed_at - started_ms) / 1000 for j in journal for b in j)
            lost = tuple(f"{e['interval']} at {(e['at'] - started_ms) / 1000:.2f} s"
                         for e in fenced_events(store, int(started_ms)))
        else:
            batches = len(store.batches(spec.name))
        return Measured(elapsed, counts, batches, store.counters(spec.name)["records"], commits_at, lost)
    finally:
        store.close()


def warm_up(spark: Any, folder: str, tws: bool, continuous: bool) -> None:
    """A small run of each Spark variant, so that none pays the first use of its code paths."""
    data = records(2_000, 100)
    run_headrace(spark, data, os.path.join(folder, "headrace"), 1_000, 2)
    if continuous:
        run_headrace(spark, data, os.path.join(folder, "continuous"), 1_000, 2, mode="continuous")
    if tws:
        files = os.path.join(folder, "files")
        os.makedirs(files)
        write_files(data, files, 1_000)
        run_transform_with_state(spark, files, os.path.join(folder, "tws-checkpoint"))


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
    parser.add_argument("--skip-continuous", action="store_true", help="no continuous-mode variant")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each Spark variant (micro-batch, continuous, transformWithState) in turns; "
                             "a row is the median of its runs")
    args = parser.parse_args()
    if args.quick:
        args.records, args.keys, args.batch = 50_000, "5000", 10_000
    key_counts = [int(k) for k in args.keys.split(",")]

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"Spark {args.master}")
    print(f"workload: keyed count, {args.records:,} records landed in batches (and files) of {args.batch:,}, "
          f"drained as one micro-batch, {args.shards} shards, no output rows, counts read back from state")
    spark = spark_session(args.master, conf={"spark.sql.shuffle.partitions": str(args.shards)})
    table = []
    with tempfile.TemporaryDirectory(prefix="headrace-spark-bench-") as tmp:
        warm_up(spark, os.path.join(tmp, "warm"), not args.skip_tws, not args.skip_continuous)
        for keys in key_counts:
            table.append((keys, measure(spark, args, keys, os.path.join(tmp, f"k{keys}"))))
    print()
    print("ratios: a headrace mode's records/s divided by the row's (2.00x: that headrace mode is twice as fast)")
    print(f"{'keys':>8} {'variant':<66} {'records/s':>10} {'micro-batch is':>15} {'continuous is':>14}")
    for keys, rows in table:
        rates = dict(rows)
        micro = rates[MICRO]
        cont = rates.get(CONTINUOUS)
        for label, rate in rows:
            print(f"{keys:>8,} {label:<66} {rate:>10,.0f} {micro / rate:>14.2f}x "
                  + (f"{cont / rate:>13.2f}x" if cont is not None else f"{'—':>14}"))
    print(f"peak memory of the Python driver: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    spark.stop()


MICRO = "headrace micro-batch (exactly-once, strong productions, SQLite)"
CONTINUOUS = "headrace continuous (exactly-once, strong productions, SQLite)"
TWS = "transformWithState (Row API, RocksDB)"


def check(label: str, got: Measured, oracle: dict[str, int], records: int) -> None:
    """The variant's state, read back after its run, must be the oracle's counts, every key and no
    other, from every input row; and it must have drained the input as one micro-batch."""
    assert got.counts == oracle, (f"{label}: counts read back from its state differ from the oracle "
                                  f"({len(got.counts):,} keys against {len(oracle):,})")
    assert got.rows == records, f"{label}: processed {got.rows:,} input rows, not {records:,}"
    assert got.batches == 1, (f"{label}: drained the input in {got.batches} micro-batches (continuous: commits of "
                              f"one interval), not 1 as the others")


def measure(spark: Any, args: Any, keys: int, tmp: str) -> list[tuple[str, float]]:
    """Each Spark variant ``--repeats`` times, in turns (micro-batch, continuous,
    ``transformWithState``), so that the machine's drift falls on each alike; a row is the median."""
    data = records(args.records, keys)
    oracle = dict(Counter(r["key"] for r in data))
    bare_s, bare_counts = run_bare(make_input(args.records, keys))
    assert bare_counts == oracle, "the bare loop's counts differ from the oracle"  # same seed, same keys
    files = os.path.join(tmp, "files")
    if not args.skip_tws:
        os.makedirs(files)
        write_files(data, files, args.batch)
    rates: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        hr = run_headrace(spark, data, os.path.join(tmp, f"strong-{repeat}"), args.batch, args.shards)
        check("headrace", hr, oracle, args.records)
        rates.setdefault(MICRO, []).append(args.records / hr.seconds)
        if not args.skip_continuous:
            cont = run_headrace(spark, data, os.path.join(tmp, f"continuous-{repeat}"), args.batch, args.shards,
                                mode="continuous")
            check("headrace continuous", cont, oracle, args.records)
            rates.setdefault(CONTINUOUS, []).append(args.records / cont.seconds)
            print(f"  {keys:,} keys: continuous run {repeat + 1}: {rates[CONTINUOUS][-1]:,.0f} records/s in "
                  f"{cont.seconds:.2f} s; interval commits journaled at "
                  f"{', '.join(f'{t:.2f}' for t in sorted(cont.commits_at))} s; intervals lost to the other worker: "
                  f"{', '.join(cont.fenced) or 'none'}", flush=True)
        if not args.skip_tws:
            tws = run_transform_with_state(spark, files, os.path.join(tmp, f"tws-checkpoint-{repeat}"))
            check("transformWithState", tws, oracle, args.records)
            rates.setdefault(TWS, []).append(args.records / tws.seconds)
        print(f"  {keys:,} keys: run {repeat + 1}: " + ", ".join(f"{label.split(' (')[0]} {r[-1]:,.0f}"
                                                              for label, r in rates.items()) + " records/s", flush=True)
    if args.repeats > 1:
        for label, got in rates.items():
            spread = max(got) / min(got) - 1
            goal = (f" (goal: under 20%: {'met' if spread < 0.2 else 'NOT met'})" if label == CONTINUOUS else "")
            print(f"  {keys:,} keys: {label} over {args.repeats} runs: {min(got):,.0f} to {max(got):,.0f} "
                  f"records/s, the fastest {spread:.0%} above the slowest{goal}", flush=True)
    rows = [("bare in-memory loop", args.records / bare_s), (MICRO, statistics.median(rates[MICRO]))]
    if CONTINUOUS in rates:
        rows.append((CONTINUOUS, statistics.median(rates[CONTINUOUS])))
    if not args.skip_weak:
        weak = run_headrace(spark, data, os.path.join(tmp, "weak"), args.batch, args.shards,
                            semantics="at_least_once", productions="weak")
        check("headrace (at-least-once)", weak, oracle, args.records)
        rows.append(("headrace micro-batch (at-least-once, weak productions, SQLite)", args.records / weak.seconds))
    if TWS in rates:
        rows.append((TWS, statistics.median(rates[TWS])))
    print(f"  {keys:,} keys: each variant drained {args.records:,} records in one micro-batch (continuous: one "
          f"commit per interval); "
          f"{len(oracle):,} per-key counts read back from each one's state and equal to the oracle", flush=True)
    for label, rate in rows:
        print(f"  {keys:,} keys: {label}: {rate:,.0f} records/s", flush=True)
    return rows


if __name__ == "__main__":
    main()
