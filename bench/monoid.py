"""Monoid computations against their plain versions on Spark: a keyed count and a windowed sum over
a Zipf-skewed input, same input, same run, in both execution modes.

    .venv/bin/python bench/monoid.py                    # 500,000 records over 5,000 keys (Zipf)
    .venv/bin/python bench/monoid.py --quick            # 50,000 records, each variant once: a smoke run
    .venv/bin/python bench/monoid.py --modes microbatch

The equal work, for every variant:
- the same input (key popularity Zipf-like, weight 1/rank, over ``--keys`` keys; timestamps over
  60 s of event time, up to 200 ms out of order), a typed stream (``key STRING, n BIGINT, ts
  BIGINT``, so its segments keep the fields as columns too), landed on headrace's bus before the clock
  starts, in batches of ``--batch`` (once; each variant starts from a copy of that store); each
  variant is then one computation that drains it
  (``headrace.run`` from start to return), exactly-once, strong productions, SQLite store;
- a keyed count: one count per key, emitted once the input has ended; a windowed sum: the sum of
  ``n`` per key and 10-second window, emitted when the watermark closes the window. Every count and
  sum is produced to a stream, and read back after the clock stops and compared with a
  plain-Python oracle of the input: every key and window, once;
- plain: a ``Computation`` whose ``process_record`` keeps the count (or the window's sums) in
  ``ctx.state`` and sets its timer the first time it sees a key (or window), whose
  ``process_timer`` produces it; monoid: a ``MonoidComputation`` with the same emission, whose
  records are folded in Spark's read tasks (micro-batch) or the worker's pass (continuous) before
  their shard, and whose partials are merged as delta rows. Two monoids each: hand-written
  (``lift``, ``window`` and ``combine`` as methods, called per record) and built-in
  (``headrace.monoids``: ``constant(1)`` or ``field("n")``, ``tumbling(10_000)``, ``add``),
  which folds whole field columns of the typed stream.
The SparkSession is shared and warmed up by a small run of each variant; start-up is excluded.
Each variant's run over 2,000 records is timed too, as its fixed cost: the script prints the ratios
of the whole runs, and again with that fixed cost taken off each. Each variant runs ``--repeat``
times (3), the variants taking turns, and the ratios compare medians: on this 2-core machine one
run of the same variant can take twice as long as the next.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

from headrace import Computation, MonoidComputation, Topology, injectors, key_by, read, run
from headrace.model import END_OF_TIME
from headrace.monoids import add, constant, field, tumbling
from headrace.spark.session import spark_session

WINDOW = 10_000


def records(n: int, keys: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(keys)]
    names = rng.choices([f"k{k}" for k in range(keys)], weights=weights, k=n)
    return [{"key": names[i], "n": rng.randrange(100), "ts": 1_000_000 + i * 60_000 // n - rng.randrange(200)}
            for i in range(n)]


def window_end(ts: int) -> int:
    return ts - ts % WINDOW + WINDOW


class PlainCount(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        count = ctx.state
        if count is None:
            ctx.set_timer("end", END_OF_TIME)
            count = 0
        ctx.state = count + 1

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("out", {"key": ctx.key, "end": timer.timestamp, "value": ctx.state})
        ctx.state = None


class MonoidCount(MonoidComputation):
    def zero(self) -> int:
        return 0

    def lift(self, record: Any) -> int:
        return 1

    def combine(self, a: int, b: int) -> int:
        return a + b

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("out", {"key": ctx.key, "end": timer.timestamp, "value": aggregate})


class PlainWindowSum(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        sums = ctx.state or {}
        end = window_end(record.timestamp)
        if end not in sums:
            sums[end] = 0
            ctx.set_timer(str(end), end)
        sums[end] += record.value["n"]
        ctx.state = sums

    def process_timer(self, ctx: Any, timer: Any) -> None:
        sums = ctx.state
        ctx.produce("out", {"key": ctx.key, "end": timer.timestamp, "value": sums.pop(timer.timestamp)})
        ctx.state = sums or None


class MonoidWindowSum(MonoidCount):
    def lift(self, record: Any) -> int:
        return record.value["n"]

    def window(self, record: Any) -> int:
        return window_end(record.timestamp)


class BuiltinCount(MonoidCount):
    """The keyed count from ``headrace.monoids``' hooks: folded from the typed stream's columns."""
    lift = constant(1)
    combine = add


class BuiltinWindowSum(MonoidCount):
    """The windowed sum from ``headrace.monoids``' hooks: folded from the typed stream's columns."""
    lift = field("n")
    window = tumbling(WINDOW)
    combine = add


VARIANTS = {"keyed count": (PlainCount, MonoidCount, BuiltinCount),
            "windowed sum": (PlainWindowSum, MonoidWindowSum, BuiltinWindowSum)}
SCHEMA = "key STRING, n BIGINT, ts BIGINT"  # the input is a typed stream (Topology.stream) for every variant


def oracles(data: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], int]]:
    sums: Counter[tuple[str, int]] = Counter()
    for r in data:
        sums[(r["key"], window_end(r["ts"]))] += r["n"]
    return {"keyed count": {(k, END_OF_TIME): n for k, n in Counter(r["key"] for r in data).items()},
            "windowed sum": dict(sums)}


def land(spark: Any, data: list[dict[str, Any]], folder: str, batch: int, mode: str) -> str:
    """Publishes the input to a store's bus once per mode (untimed); each variant starts from a
    copy. The landing is the measured topology without its computation, in the variant's mode: a
    store's stream belongs to one topology (monitor/owners.py), which keeps one mode."""
    os.makedirs(folder)
    url = f"sqlite:///{folder}/store.db"
    bus = Topology("monoid_bench")
    bus.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    bus.stream("events", schema=SCHEMA)
    run(bus, store=url, spark=spark, progress=None, mode=mode)
    db = sqlite3.connect(f"{folder}/store.db")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return f"{folder}/store.db"


def run_variant(spark: Any, cls: type[Computation], data: list[dict[str, Any]], landed: str, folder: str,
                batch: int, shards: int, mode: str) -> tuple[float, dict[tuple[str, int], int], int]:
    """Times ``cls`` draining the landed input in a copy of its store; returns the seconds, the
    outputs read back, and how many records were emitted (each key and window must be once)."""
    os.makedirs(folder)
    shutil.copy(landed, f"{folder}/store.db")
    url = f"sqlite:///{folder}/store.db"
    t = Topology("monoid_bench")
    t.inject("events", injectors.records(data, timestamp="ts", batch_size=batch))
    t.stream("events", schema=SCHEMA)
    t.add(cls, inputs={"events": key_by("key")}, outputs=["out"], shards=shards)
    start = time.perf_counter()
    run(t, store=url, spark=spark, progress=None, mode=mode, trigger_ms=50 if mode == "microbatch" else None)
    elapsed = time.perf_counter() - start
    out = list(read("out", url))
    shutil.rmtree(folder)  # a copy of the bus per run: 36 of them would fill a small disk
    return elapsed, {(r.value["key"], r.value["end"]): r.value["value"] for r in out}, len(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--modes", default="microbatch,continuous")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant; the medians are compared")
    parser.add_argument("--quick", action="store_true", help="50,000 records in batches of 10,000, once each")
    args = parser.parse_args()
    if args.quick:
        args.records, args.batch, args.repeat = 50_000, 10_000, 1
    modes = args.modes.split(",")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"Spark {args.master}")
    print(f"workload: {args.records:,} records over {args.keys:,} keys (Zipf, weight 1/rank), 60 s of event time, "
          f"landed in batches of {args.batch:,}, {args.shards} shards, exactly-once, SQLite; windowed sum per "
          f"{WINDOW // 1000} s window")
    spark = spark_session(args.master, conf={"spark.sql.shuffle.partitions": str(args.shards)})
    data = records(args.records, args.keys)
    expected = oracles(data)
    table: list[tuple[Any, ...]] = []
    with tempfile.TemporaryDirectory(prefix="headrace-monoid-bench-") as tmp:
        small = records(2_000, 100)
        small_landed = {mode: land(spark, small, os.path.join(tmp, f"warm-bus-{mode}"), 1_000, mode) for mode in modes}
        landed = {mode: land(spark, data, os.path.join(tmp, f"bus-{mode}"), args.batch, mode) for mode in modes}
        for mode in modes:  # warm-up: a small run of every variant
            for what, classes in VARIANTS.items():
                for cls in classes:
                    run_variant(spark, cls, small, small_landed[mode], os.path.join(tmp, f"warm-{mode}-{cls.__name__}"),
                                1_000, 2, mode)
        for mode in modes:
            for what, classes in VARIANTS.items():
                wholes: dict[type, list[float]] = {cls: [] for cls in classes}
                fixeds: dict[type, list[float]] = {cls: [] for cls in classes}
                for rep in range(args.repeat):  # the variants take turns, so a slow spell hits each alike
                    for cls in classes:
                        fixed, _, _ = run_variant(spark, cls, small, small_landed[mode],
                                                  os.path.join(tmp, f"fixed-{mode}-{cls.__name__}-{rep}"), 1_000,
                                                  args.shards, mode)
                        seconds, got, emitted = run_variant(spark, cls, data, landed[mode],
                                                            os.path.join(tmp, f"{mode}-{cls.__name__}-{rep}"),
                                                            args.batch, args.shards, mode)
                        assert got == expected[what] and emitted == len(expected[what]), (
                            f"{mode} {cls.__name__}: its output differs from the oracle")
                        wholes[cls].append(seconds)
                        fixeds[cls].append(fixed)
                        print(f"  {mode} {what}: {cls.__name__}: {args.records / seconds:,.0f} records/s "
                              f"({emitted:,} outputs equal to the oracle); a run of {len(small):,} records took "
                              f"{fixed:.2f} s", flush=True)
                rates = [args.records / statistics.median(wholes[cls]) for cls in classes]
                net = [args.records / max(statistics.median(wholes[cls]) - statistics.median(fixeds[cls]), 1e-3)
                       for cls in classes]
                table.append((mode, what, rates, net))
    print()
    print(f"ratio: each monoid's records/s divided by the plain computation's, same input, same run, each the "
          f"median of {args.repeat} run(s);")
    print("hand-written: lift/window/combine as methods, folded a record at a time; built-in: headrace.monoids'")
    print("field/constant/tumbling and add, folded from the typed stream's field columns")
    header = (f"{'mode':<11} {'workload':<13} {'plain rec/s':>12} {'hand-written':>13} {'built-in':>10} "
              f"{'hand-written is':>16} {'built-in is':>12}")
    for title, column in (("whole runs", 2), (f"less each variant's fixed cost (its run over {len(small):,} records: "
                                              "starting and stopping the query or the workers)", 3)):
        print(title)
        print(header)
        for row in table:
            plain, hand, builtin = row[column]
            print(f"{row[0]:<11} {row[1]:<13} {plain:>12,.0f} {hand:>13,.0f} {builtin:>10,.0f} "
                  f"{hand / plain:>15.2f}x {builtin / plain:>11.2f}x")
        print()
    print(f"peak memory of the Python driver: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    spark.stop()


if __name__ == "__main__":
    main()
