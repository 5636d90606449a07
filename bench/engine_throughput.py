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
import statistics
import tempfile
import time
from typing import Any

from headrace import Computation, Record
from headrace.engine import DedupCache, InputRecord, ShardBatch, run_shard_batch, shard_of
from headrace.model import BEGINNING_OF_TIME, ComputationOptions
from headrace.names import id_prefix, injector
from headrace.store import open_store


class KeyedCounter(Computation):
    def process_record(self, ctx: Any, record: Record) -> None:
        ctx.state = (ctx.state or 0) + 1


def make_input(records: int, keys: int, seed: int = 7, ids: str = "positional", batch: int = 50_000) -> list[InputRecord]:
    """``ids``: "positional" as an injector gives them (``inject:in:<batch>:<n>``, batches of
    ``batch`` records), or "arbitrary" (``r<i>``, as an injector's ``id=`` function might)."""
    rng = random.Random(seed)
    names = [f"key-{i}" for i in range(keys)]
    if ids == "positional":
        made = [f"{id_prefix(injector('in'), i // batch + 1)}{i % batch}" for i in range(records)]
    else:
        made = [f"r{i}" for i in range(records)]
    return [InputRecord("in", names[rng.randrange(keys)], {"n": i}, 1_000_000 + i, made[i]) for i in range(records)]


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


def run_engine(data: list[InputRecord], batch_size: int, shards: int, folder: str, label: str = "default",
               oracle: dict[str, Any] | None = None, **options: Any) -> float:
    """The seconds the engine takes over ``data`` in batches of ``batch_size``; with ``oracle``,
    each key's state is read back from the store afterwards and must equal it."""
    store = open_store(f"sqlite:///{folder}/bench-{label}.db")
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
    total = store.counters("KeyedCounter")["records"]
    assert total == len(data), f"{label}: the engine processed {total} of {len(data)} records"
    if oracle is not None:
        codec = opts.codec
        got = {key: codec.decode(raw) for key in oracle if (raw := store.state("KeyedCounter", key)) is not None}
        assert got == oracle, f"{label}: the states read back differ from the bare loop's"
    store.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each engine variant, in turn; the median counts")
    parser.add_argument("--profile", action="store_true", help="profile the exactly-once variant with pyinstrument")
    args = parser.parse_args()
    if args.profile:
        profile(args)
        return

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"workload: keyed counter, {args.records:,} records over {args.keys:,} keys, "
          f"batches of {args.batch:,}, {args.shards} shards; ids as an injector gives them "
          f"(inject:in:<batch>:<n>) unless the row says otherwise")
    data = make_input(args.records, args.keys, batch=args.batch)
    arbitrary = make_input(args.records, args.keys, ids="arbitrary")
    bare_s, bare_states = run_bare(data)
    rows = [("bare in-memory loop (dict state, no persistence)", bare_s)]
    variants: list[tuple[str, list[InputRecord], dict[str, Any]]] = [
        (DEDUP, data, {}),
        ("headrace engine + SQLite, exactly-once, dedup, arbitrary ids (r<i>)", arbitrary, {}),
        ("headrace engine + SQLite, exactly-once, no dedup", data, {"dedup": False}),
        (AT_LEAST_ONCE, data, {"semantics": "at_least_once"}),
    ]
    times: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as folder:
        for repeat in range(args.repeats):  # in turn, so that the machine's drift touches each alike
            for n, (label, records, options) in enumerate(variants):
                times[label].append(run_engine(records, args.batch, args.shards, folder, f"{repeat}-{n}",
                                               bare_states if repeat == 0 else None, **options))
    rows += [(label, statistics.median(times[label])) for label, _, _ in variants]
    print(f"each variant's states equal the bare loop's; median of {args.repeats} runs each")
    print(f"{'variant':<72} {'records/s':>12} {'vs bare':>9}")
    for label, elapsed in rows:
        print(f"{label:<72} {len(data) / elapsed:>12,.0f} {bare_s / elapsed:>8.3f}x")
    cost = statistics.median(times[DEDUP]) / statistics.median(times[AT_LEAST_ONCE]) - 1
    print(f"exactly-once with dedup costs {cost:+.1%} in time against at-least-once without dedup "
          f"(goal: within 15%: {'met' if cost <= 0.15 else 'NOT met'}); "
          f"runs: {', '.join(f'{t:.2f}' for t in times[DEDUP])} s against "
          f"{', '.join(f'{t:.2f}' for t in times[AT_LEAST_ONCE])} s")


DEDUP = "headrace engine + SQLite, exactly-once, strong productions, dedup"
AT_LEAST_ONCE = "headrace engine + SQLite, at-least-once"


def profile(args: argparse.Namespace) -> None:
    from pyinstrument import Profiler

    data = make_input(args.records, args.keys, batch=args.batch)
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as folder:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        run_engine(data, args.batch, args.shards, folder)
        profiler.stop()
    print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
