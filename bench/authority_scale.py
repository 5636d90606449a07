"""The watermark authority and the store with many key intervals (MillWheel's authority handled
500,000): how the per-round and per-batch costs grow from 100 to 100,000 intervals of one
computation fed by one injector, on SQLite and on a real PostgreSQL server.

    .venv/bin/python bench/authority_scale.py [--intervals 100,1000,10000,100000]
        [--stores sqlite,postgresql] [--postgres postgresql://user@host:port/postgres] [--repeat 20]

Every step is headrace's own code on a real store, with N intervals registered:

- start: ``register`` the computation, declare the bus producers (the injector and every
  interval ``C/<i>``), one worker's first ``maintain_leases`` (claims every interval) and its next
  one (renews them), and the micro-batch runner's ``acquire_writer`` (fences every shard); at the
  end, the worker's ``release_all`` (it stops and frees every lease);
- one worker pass after the injector publishes one batch of 100 records whose keys fall into 10
  of the N intervals (routed to them: keyed delivery): the 10 commit, in one transaction with the
  one statement that reports the other N - 10 quiet (median of ``--repeat`` batches; issue 21's
  goal: at most 2x the same pass at N=100); and an idle pass (nothing new);
- one watermark-authority round (``ContinuousRunner.refresh_watermarks``): every interval's
  journaled watermarks read, the minimum journaled under ``C``;
- one ``status()`` read (``monitor/status.py``), which each driver's monitor makes every second
  and ``headrace status`` makes once;
- one interval's commit of a 5-record batch (``prepare_shard_batch`` + ``commit_together``, the
  worker's path), and the micro-batch runner's shard commit (``run_shard_batch``) and batch
  completion (``finish_batch``).

Prints each step's time per N and its ratio to the smallest N, measured in the same run. Without
``--postgres`` a server is started from the machine's binaries (tests/postgres_server.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from headrace import Computation, Topology, injectors, key_by  # noqa: E402
from headrace.engine import DedupCache, InputRecord, ShardBatch, run_shard_batch  # noqa: E402
from headrace.engine.runner import PreparedBatch, commit_together, finish_batch, prepare_shard_batch  # noqa: E402
from headrace.engine.batch import shard_of  # noqa: E402
from headrace.engine.publish import publish_injected  # noqa: E402
from headrace.engine.routing import RoutingPlan  # noqa: E402
from headrace.engine.worker import Worker  # noqa: E402
from headrace.names import interval as interval_producer  # noqa: E402
from headrace.model import BEGINNING_OF_TIME, ComputationOptions  # noqa: E402
from headrace.monitor.status import status_of  # noqa: E402
from headrace.names import CONTINUOUS  # noqa: E402
from headrace.names import meta  # noqa: E402
from headrace.plans import interval_plans as plans_of, producers_of, routing_plan  # noqa: E402
from headrace.spark.continuous import ContinuousRunner  # noqa: E402
from headrace.store import open_store  # noqa: E402

C, MICRO, INJECTOR = "Count", "MicroCount", "inject:events"
LEASE_MS = 3_000


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counted", {"k": ctx.key, "n": ctx.state})


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def topology(n: int) -> Topology:
    t = Topology("authority-scale")
    t.inject("events", injectors.records([], timestamp="ts"))
    t.add(Count, inputs={"events": key_by("k")}, outputs=["counted"], shards=n)
    return t


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_of(repeat: int, fn: Callable[[int], Any]) -> float:
    return statistics.median(timed(lambda: fn(r)) for r in range(repeat))


def ten_keys(n: int) -> list[str]:
    """Keys of 10 different intervals of N."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < min(10, n):
        keys.setdefault(shard_of(f"k{i}", n), f"k{i}")
        i += 1
    return list(keys.values())


def publish(store: Any, plan: RoutingPlan, batch: int, keys: list[str], watermark: int) -> None:
    """100 records of ``keys``, routed to their intervals."""
    publish_injected(store, INJECTOR, batch, "events",
                     [({"k": keys[i % len(keys)], "ts": watermark + i}, watermark + i, None) for i in range(100)],
                     watermark, str(batch), None, plan, 1)


def measure(url: str, n: int, repeat: int) -> dict[str, float]:
    """One N on one fresh database: seconds per step."""
    t = topology(n)
    store = open_store(url)
    clock = Clock()
    out: dict[str, float] = {}
    out["register N intervals"] = timed(lambda: store.register(C, n, CONTINUOUS))

    def declare_streams() -> None:
        for s in sorted(t.streams()):
            store.declare_stream(s, *producers_of(t, s, CONTINUOUS))

    out["declare the bus producers"] = timed(declare_streams)
    worker = Worker(store, plans_of(t), "bench-worker", 0, 1, lease_ms=LEASE_MS, clock=clock)
    out["claim every interval (first leases)"] = timed(worker.maintain_leases)
    assert len(worker.owned[C]) == n, f"claimed {len(worker.owned[C])} of {n}"
    clock.now += LEASE_MS // 4
    out["renew every lease"] = timed(worker.maintain_leases)
    store.register(MICRO, n)
    out["micro-batch acquire_writer"] = timed(lambda: store.acquire_writer(MICRO))

    plan = routing_plan(t)
    store.register_plan(plan.id, plan.routes)
    keys = ten_keys(n)
    publish(store, plan, 1, keys, 1_000)
    out["first worker pass (10 of N commit)"] = timed(worker.step)
    committed = store.latest_batches([interval_producer(C, i) for i in range(n)])
    assert sorted(committed) == sorted(interval_producer(C, shard_of(k, n)) for k in keys), committed

    def pass_after_a_batch(r: int) -> None:
        publish(store, plan, r + 2, keys, 1_000 + 100 * (r + 1))
        began = time.perf_counter()
        assert worker.step()
        passes.append(time.perf_counter() - began)
    passes: list[float] = []
    for r in range(args_repeat(repeat)):
        pass_after_a_batch(r)
    out["worker pass: batch into 10 of N intervals"] = statistics.median(passes)
    out["worker pass: nothing new (idle)"] = median_of(repeat, lambda r: worker.step())

    runner = ContinuousRunner(t, url, ui=False)
    try:
        store.put_meta(meta.driver(t.name), runner.driver_id)

        def authority_round(r: int) -> None:
            runner._marks.clear()  # so that every round also journals, as when the watermark moved
            runner.refresh_watermarks(store)
        out["authority round (read N, journal 1)"] = median_of(repeat, authority_round)
        runner._record_topology()
        out["status(), which a driver's monitor reads each second"] = median_of(repeat, lambda r: status_of(store))
    finally:
        runner.store.close()

    out["interval commit, 5 records"] = median_of(repeat, lambda r: interval_commit(store, worker, r))
    micro_seq = store.acquire_writer(MICRO)
    out["micro-batch shard commit, 5 records"] = median_of(repeat, lambda r: shard_commit(store, micro_seq, r))
    out["micro-batch finish_batch"] = median_of(
        repeat, lambda r: finish_batch(store, MICRO, r + 1, 1_000 + r, BEGINNING_OF_TIME, micro_seq))
    out["release every lease (worker stops)"] = timed(worker.release_all)
    store.close()
    return out


OPTIONS = ComputationOptions.from_kwargs(C, {})
CACHE = DedupCache()


def records(r: int) -> list[InputRecord]:
    return [InputRecord("events", f"k{i}", {"k": f"k{i}"}, 2_000 + r, f"bench:{r}:{i}") for i in range(5)]


def interval_commit(store: Any, worker: Worker, r: int) -> None:
    """Interval 0 commits one more batch, as a worker's pass with only it ready would."""
    interval = worker.owned[C][0]
    positions = worker.groups[C].group_of(0).positions
    batch = ShardBatch(C, 0, interval.version + 1, records(r), 1_000, 1_000, 0, interval.claim.sequencer,
                       positions=dict(positions), journal_as=interval_producer(C, 0))
    prepared = prepare_shard_batch(worker.code[C], C, OPTIONS, frozenset({"counted"}), store, batch, CACHE)
    assert isinstance(prepared, PreparedBatch), "a new batch that journals has a commit"
    outcome = commit_together(store, [prepared])[0]
    assert not isinstance(outcome, Exception), outcome
    interval.claim = interval.claim._replace(version=batch.batch)


def shard_commit(store: Any, sequencer: int, r: int) -> None:
    run_shard_batch(Count(), MICRO, OPTIONS, frozenset({"counted"}), store,
                    ShardBatch(MICRO, 0, r + 1, records(r), 1_000, 1_000, 0, sequencer), CACHE)


def args_repeat(repeat: int) -> int:
    return max(5, repeat)


def fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.2f} ms" if seconds >= 0.001 else f"{seconds * 1e6:.0f} us"


def report(store_name: str, sizes: list[int], results: dict[int, dict[str, float]]) -> None:
    steps = list(results[sizes[0]])
    head = f"{'step (' + store_name + ')':<44}" + "".join(f"{'N=' + format(n, ','):>22}" for n in sizes)
    print(head)
    print("-" * len(head))
    for step in steps:
        base = results[sizes[0]][step]
        cells = [f"{fmt(results[n][step])} ({results[n][step] / base:.1f}x)" for n in sizes]
        print(f"{step:<44}" + "".join(f"{c:>22}" for c in cells))
    goal = "worker pass: batch into 10 of N intervals"
    ratio = results[sizes[-1]][goal] / results[sizes[0]][goal]
    print(f"goal: a pass after a batch into 10 of N intervals costs at most 2x the pass at N={sizes[0]:,}: "
          f"N={sizes[-1]:,} is {ratio:.2f}x ({'met' if ratio <= 2 else 'MISSED'})")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="100,1000,10000,100000", help="comma-separated N, smallest first")
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--postgres", default=None, help="admin URL of a running server (default: start one)")
    parser.add_argument("--repeat", type=int, default=20, help="rounds of each per-round step (median)")
    args = parser.parse_args()
    sizes = sorted(int(x) for x in args.intervals.split(","))
    stores = args.stores.split(",")
    unknown = set(stores) - {"sqlite", "postgresql"}
    if unknown:
        parser.error(f"--stores takes sqlite and postgresql, got {sorted(unknown)}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}")
    print(f"one computation of N intervals fed by one injector; per-round steps: median of {args.repeat}")
    print("ratios: against N=" + format(sizes[0], ",") + " in this run\n")
    server = None
    with tempfile.TemporaryDirectory(prefix="headrace-authority-") as folder:
        try:
            for name in stores:
                results = {}
                for n in sizes:
                    if name == "sqlite":
                        url = f"sqlite:///{folder}/n{n}.db"
                    else:
                        if server is None:
                            from tests.postgres_server import PostgresServer
                            server = PostgresServer(args.postgres).start()
                            assert server.admin_url is not None, "a started server has its admin URL"
                            print(f"PostgreSQL: {server_version(server.admin_url)}\n")
                        url = server.new_database()
                    began = time.perf_counter()
                    results[n] = measure(url, n, args.repeat)
                    print(f"  {name} N={n:,}: {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
                report(name, sizes, results)
        finally:
            if server is not None:
                server.stop()


def server_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as db:
        row = db.execute("SHOW server_version").fetchone()
        assert row is not None
        return str(row[0])


if __name__ == "__main__":
    main()
