"""Engine + SQLite store throughput against a bare in-memory loop, same computation, same run.

    .venv/bin/python bench/engine_throughput.py [--records 500000] [--keys 50000] [--batch 50000]
    .venv/bin/python bench/engine_throughput.py --profile   # where the engine's time goes (pyinstrument)

Prints records/s for each and the ratio. The bare loop is the bound for per-record Python work:
a dict for state, no persistence, no dedup, no timers machinery.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import time
from typing import Any

from headrace import Computation, Record
from headrace.engine import DedupCache, InputRecord, ShardBatch, run_shard_batch, shard_of
from headrace.model import BEGINNING_OF_TIME, ComputationOptions
from headrace.store import open_store


class KeyedCounter(Computation):
    def process_record(self, ctx: Any, record: Record) -> None:
        ctx.state = (ctx.state or 0) + 1


def make_input(records: int, keys: int, seed: int = 7) -> list[InputRecord]:
    rng = random.Random(seed)
    names = [f"key-{i}" for i in range(keys)]
    return [InputRecord("in", names[rng.randrange(keys)], {"n": i}, 1_000_000 + i, f"r{i}") for i in range(records)]


class BareContext:
    """The minimum a Computation needs: a key and a dict-backed state."""

    __slots__ = ("key", "states", "low_watermark")

    def __init__(self, states: dict[str, Any]):
        self.states = states
        self.key = ""
        self.low_watermark = BEGINNING_OF_TIME

    @property
    def state(self) -> Any:
        return self.states.get(self.key)

    @state.setter
    def state(self, value: Any) -> None:
        self.states[self.key] = value

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass


def run_bare(data: list[InputRecord]) -> tuple[float, dict[str, Any]]:
    comp = KeyedCounter()
    states: dict[str, Any] = {}
    ctx = BareContext(states)
    start = time.perf_counter()
    for r in data:
        ctx.key = r.key
        comp.process_record(ctx, Record(r.key, r.value, r.timestamp, r.id))
    return time.perf_counter() - start, states


def run_engine(data: list[InputRecord], batch_size: int, shards: int, folder: str, **options: Any) -> float:
    store = open_store(f"sqlite:///{folder}/bench-{'-'.join(f'{k}{v}' for k, v in options.items()) or 'default'}.db")
    opts = ComputationOptions.from_kwargs("KeyedCounter", {"shards": shards, **options})
    store.register("KeyedCounter", shards)
    seq = store.acquire_writer("KeyedCounter")
    comp, cache = KeyedCounter(), DedupCache()
    start = time.perf_counter()
    for b, offset in enumerate(range(0, len(data), batch_size), start=1):
        chunk = data[offset: offset + batch_size]
        by_shard: dict[int, list[InputRecord]] = {}
        for r in chunk:
            by_shard.setdefault(shard_of(r.key, shards), []).append(r)
        wm = chunk[0].timestamp
        for shard, records in sorted(by_shard.items()):
            batch = ShardBatch("KeyedCounter", shard, b, records, wm, wm, 0, seq, frozenset({"in"}))
            run_shard_batch(comp, "KeyedCounter", opts, None, store, batch, cache)
    elapsed = time.perf_counter() - start
    total = sum(store.counters("KeyedCounter").values()) and store.counters("KeyedCounter")["records"]
    assert total == len(data), f"engine processed {total} of {len(data)} records"
    store.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="profile the exactly-once variant with pyinstrument")
    args = parser.parse_args()
    if args.profile:
        profile(args)
        return

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"workload: keyed counter, {args.records:,} records over {args.keys:,} keys, "
          f"batches of {args.batch:,}, {args.shards} shards")
    data = make_input(args.records, args.keys)
    bare_s, bare_states = run_bare(data)
    bare_rate = len(data) / bare_s
    rows = [("bare in-memory loop (dict state, no persistence)", bare_s, 1.0)]
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as folder:
        variants = [
            ("headrace engine + SQLite, exactly-once, strong productions, dedup", {}),
            ("headrace engine + SQLite, exactly-once, no dedup", {"dedup": False}),
            ("headrace engine + SQLite, at-least-once", {"semantics": "at_least_once"}),
        ]
        for label, options in variants:
            elapsed = run_engine(data, args.batch, args.shards, folder, **options)
            rows.append((label, elapsed, bare_s / elapsed))
    print(f"{'variant':<68} {'records/s':>12} {'vs bare':>9}")
    for label, elapsed, ratio in rows:
        print(f"{label:<68} {len(data) / elapsed:>12,.0f} {ratio:>8.3f}x")
    print(f"bare loop: {bare_rate:,.0f} records/s over {len(bare_states):,} keys")


def profile(args: argparse.Namespace) -> None:
    from pyinstrument import Profiler

    data = make_input(args.records, args.keys)
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as folder:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        run_engine(data, args.batch, args.shards, folder)
        profiler.stop()
    print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
