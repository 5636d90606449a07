"""How long the bus's trim holds the pipeline's commits back on SQLite (one writer at a time).

    .venv/bin/python bench/trim_stall.py [--batches 2000] [--dests 4] [--value-bytes 400] [--rounds 3]

A store holds ``--batches`` batches of one producer (what 10 s of a 2,000 records/s injector in
batches of 10 leaves: a segment and ``--dests`` routed segments per batch, with their journal rows),
all read by their reader and older than the replay window. A second process commits a small
transaction every 5 ms, as a pipeline's workers do, and times each commit (from BEGIN IMMEDIATE to
COMMIT returned: the wait for the write lock included). Meanwhile the trim forgets those batches,
once in one statement per table (``TRIM_STEP_BATCHES`` past the batch count: the trim before
2026-11-25) and once in steps (the store's ``TRIM_STEP_BATCHES``), ``--rounds`` times each,
alternating. Printed per variant: the trim's wall time and the writer's commit p50/p99/max while
the trim ran, and the ratio of the stepped trim's worst commit to the bulk trim's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from multiprocessing.queues import Queue
from typing import Any

from headrace.store import SQLiteStore, open_store
from headrace.store.monitoring import WHOLE_COMPUTATION
from percentiles import percentile

READER, STREAM, PRODUCER = "sink:trim", "events", "inject:events"


def fill(url: str, batches: int, dests: int, value_bytes: int, now: int) -> None:
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    blob = os.urandom(value_bytes * 10)
    with store._transaction():
        store._x("INSERT INTO streams VALUES (?, ?) ON CONFLICT DO NOTHING", (STREAM, PRODUCER))
        for b in range(1, batches + 1):
            store._x("INSERT INTO segments VALUES (?, ?, ?, 0, 10, ?, ?)", (STREAM, PRODUCER, b, blob, now - 60_000))
            store._x("INSERT INTO batches VALUES (?, ?, 0, 0, ?, NULL, NULL)", (PRODUCER, b, now - 60_000))
            for d in range(dests):
                store._x("INSERT INTO routes VALUES (?, ?, ?, ?, ?, 0, 3, ?)",
                         (READER, d, PRODUCER, b, STREAM, blob[: len(blob) // dests]))
    store.record_positions(READER, WHOLE_COMPUTATION, {PRODUCER: batches})
    store.close()


def writer(path: str, stop: Any, out: Any) -> None:
    """A commit every 5 ms, taking the write lock as the store's writers do (``SQLiteStore._begin``)."""
    store = open_store(f"sqlite:///{path}")
    assert isinstance(store, SQLiteStore)
    store._x("CREATE TABLE IF NOT EXISTS writer_log(at INTEGER, blob BLOB)")
    times: list[tuple[float, float]] = []
    while not stop.is_set():
        started = time.monotonic()
        with store._transaction():
            store._x("INSERT INTO writer_log VALUES (?, ?)", (int(started * 1000), b"x" * 200))
        times.append((started, (time.monotonic() - started) * 1000))
        time.sleep(max(0.0, 0.005 - (time.monotonic() - started)))
    out.put(times)
    store.close()


def one_round(step_batches: int | None, args: Any) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store.db")
        url = f"sqlite:///{path}"
        store = open_store(url)
        now = store.now()
        store.close()
        fill(url, args.batches, args.dests, args.value_bytes, now)
        stop = mp.Event()
        out: Queue[list[tuple[float, float]]] = mp.Queue()
        proc = mp.Process(target=writer, args=(path, stop, out))
        proc.start()
        time.sleep(0.5)  # the writer runs steady before the trim starts
        store = open_store(url)
        assert isinstance(store, SQLiteStore)
        if step_batches is not None:
            store.TRIM_STEP_BATCHES = step_batches
        started = time.monotonic()
        trimmed = store.trim({READER: {STREAM: [PRODUCER]}}, {STREAM: 0}, now)
        ended = time.monotonic()
        store.close()
        time.sleep(0.2)
        stop.set()
        times = out.get()
        proc.join()
        if trimmed.routes != args.batches * args.dests or trimmed.segments != args.batches:
            raise SystemExit(f"the trim forgot {trimmed}, expected {args.batches} batches x {args.dests} routes")
        during = [ms for at, ms in times if started <= at <= ended]
        return (ended - started) * 1000, during


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--dests", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"trim_stall: {args.batches} batches x ({args.dests} routed segments + 1 segment) of 10 values of "
          f"{args.value_bytes} B; a writer commits every 5 ms; load average {os.getloadavg()[0]:.1f}")
    results: dict[str, tuple[list[float], list[float]]] = {"bulk": ([], []), "steps": ([], [])}
    for _ in range(args.rounds):
        for name, step in (("bulk", args.batches + 1), ("steps", None)):
            took, during = one_round(step, args)
            results[name][0].append(took)
            results[name][1].extend(during)
    print(f"{'variant':8} {'trim ms (median)':>17} {'commits':>8} {'commit p50':>11} {'p99':>8} {'max':>8}")
    for name, (trims, during) in results.items():
        print(f"{name:8} {statistics.median(trims):17.0f} {len(during):8d} {percentile(during, .5):11.1f} "
              f"{percentile(during, .99):8.1f} {max(during, default=float('nan')):8.1f}")
    worst = {name: max(d, default=float("nan")) for name, (_, d) in results.items()}
    print(f"worst commit during the trim, steps / bulk: {worst['steps'] / worst['bulk']:.2f}x")


if __name__ == "__main__":
    main()
