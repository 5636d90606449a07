"""A continuous worker's pass without Spark: one ``Worker`` draining a pre-published keyed count
on SQLite, with Python's cyclic garbage collector paused for the pass (as ``Worker.run`` does) and
running as usual, in turn, same input, same run.

    .venv/bin/python bench/worker_throughput.py [--records 500000] [--keys 50000] [--repeats 3]
    .venv/bin/python bench/worker_throughput.py --profile      # pyinstrument over one pass

Each run's counts are read back from the store and compared with the input's before it counts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from typing import Any, ContextManager

from headrace import Computation, Topology, injectors, key_by
from headrace.engine.batch import Production
from headrace.engine.runner import collector_paused
from headrace.engine.worker import Worker
from headrace.model import ComputationOptions
from headrace.names import CONTINUOUS, id_prefix, injector
from headrace.plans import interval_plans, producers_of
from headrace.store import open_store

PRODUCER = injector("events")


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def topology() -> Topology:
    t = Topology("worker_bench")
    t.inject("events", injectors.records([], timestamp="ts"))
    t.add(Count, inputs={"events": key_by("key")}, shards=4)
    return t


def drain(args: argparse.Namespace, folder: str, collector: ContextManager[Any], profile: bool = False) -> float:
    """Seconds one worker takes to drain the input, published first (untimed)."""
    store = open_store(f"sqlite:///{folder}/store.db")
    store.register("Count", 4, CONTINUOUS)
    t = topology()
    for stream in t.streams():
        store.declare_stream(stream, *producers_of(t, stream, CONTINUOUS))
    rng = random.Random(7)
    keys: Counter[str] = Counter()
    for b in range(0, args.records, args.batch):
        prefix = id_prefix(PRODUCER, b // args.batch + 1)
        batch = [Production("events", None, {"key": f"key-{rng.randrange(args.keys)}", "ts": 1_000 + i}, 1_000 + i,
                            f"{prefix}{i - b}") for i in range(b, min(b + args.batch, args.records))]
        keys.update(p.value["key"] for p in batch)
        store.publish(PRODUCER, b // args.batch + 1, {"events": batch}, batch[-1].timestamp, str(b))
    worker = Worker(store, interval_plans(t), "bench", 0, 1, lease_ms=10**9, clock=lambda: 10**9)
    worker.maintain_leases()
    profiler = None
    if profile:
        from pyinstrument import Profiler
        profiler = Profiler(interval=0.0005)
        profiler.start()
    start = time.perf_counter()
    with collector:
        while worker.step():
            pass
    elapsed = time.perf_counter() - start
    if profiler is not None:
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False))
    codec = ComputationOptions().codec
    got = {k: codec.decode(raw) for k in keys if (raw := store.state("Count", k)) is not None}
    assert got == dict(keys), "the worker's counts differ from the input's"
    store.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.profile:
        drain(args, tempfile.mkdtemp(prefix="headrace-bench-"), nullcontext(), profile=True)
        return
    times: dict[str, list[float]] = {"collector paused for the pass": [], "collector as usual": []}
    for _ in range(args.repeats):
        for label in times:
            with tempfile.TemporaryDirectory(prefix="headrace-bench-") as folder:
                times[label].append(drain(args, folder, collector_paused() if "paused" in label else nullcontext()))
    print(f"one worker, {args.records:,} records over {args.keys:,} keys, 4 intervals; counts equal the input's")
    for label, runs in times.items():
        print(f"{label:<32} {args.records / statistics.median(runs):>10,.0f} records/s (median; runs: "
              f"{', '.join(f'{t:.2f}' for t in runs)} s)")


if __name__ == "__main__":
    main()
