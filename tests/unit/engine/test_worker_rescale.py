"""engine/worker.py after a rescale (docs/architecture.md §3.6, "Rescaling"): continuous-mode
intervals that had read their input to different batches are re-partitioned; the new intervals
start at the slowest old position and skip, by the store's fences, what an old interval already
took for its keys, so every record is counted exactly once. A worker planned for the old layout
is refused."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from headrace import Topology, injectors, key_by
from headrace.engine.worker import Worker
from headrace.errors import FencedWriterError
from headrace.names import CONTINUOUS
from headrace.plans import interval_plans as plans_of, producers_of
from headrace.store import open_store

from .test_worker import WORDS, Clock, CountWords, publish

NAME = "CountWords"


def topology(shards: int) -> Topology:
    t = Topology("handover")
    t.inject("words", injectors.records([{"word": w, "ts": 1_000 + i} for i, w in enumerate(WORDS)], timestamp="ts"))
    t.add(CountWords, inputs={"words": key_by("word")}, outputs=["counted"], shards=shards)
    return t


def worker(store: Any, shards: int, clock: Clock, slot: int = 0, slots: int = 1) -> Worker:
    return Worker(store, plans_of(topology(shards)), f"worker-{shards}-{slot}", slot, slots, lease_ms=1_000,
                  clock=clock)


def run_until_idle(w: Worker) -> None:
    for _ in range(20):
        if not w.step():
            return
    pytest.fail("the worker still had work after 20 steps")


def counts(store: Any) -> dict[str, int]:
    import pickle

    return {w: pickle.loads(store.state(NAME, w)) for w in sorted(set(WORDS)) if store.state(NAME, w) is not None}


def test_intervals_at_different_positions_rescale_and_count_every_record_once(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    store.register(NAME, 4, "continuous")
    for stream in topology(4).streams():
        for producer in producers_of(topology(4), stream, CONTINUOUS):
            store.declare_stream(stream, producer)
    clock = Clock()
    a, b = worker(store, 4, clock, 0, 2), worker(store, 4, clock, 1, 2)
    a.maintain_leases()
    b.maintain_leases()
    assert a.owned[NAME] and b.owned[NAME]
    publish(store, 1, 0, 40, 1_000)
    run_until_idle(a)
    run_until_idle(b)
    publish(store, 2, 40, 80, 1_040)
    run_until_idle(a)  # a's intervals read batch 2; b's stop at batch 1
    positions = {s: p["inject:words"] for s, p in store.all_positions(NAME).items()}
    assert set(positions.values()) == {1, 2}
    a.release_all()
    b.release_all()

    store.register(NAME, 3)
    new = worker(store, 3, clock)
    new.maintain_leases()
    assert new.fences[NAME] == ((4, {s: {"inject:words": p} for s, p in positions.items()}),)
    run_until_idle(new)
    assert counts(store) == dict(Counter(WORDS[:80]))  # batch 2 once for every key: skipped where taken

    old = worker(store, 4, clock, 0, 1)  # a worker of an older driver, planned for 4 intervals
    clock.now += 5_000
    new.release_all()
    expected = (f"Worker {old.owner} runs 'CountWords' with 4 key intervals, but the store has 3 (got 4). Hint: the "
                "computation was rescaled by a newer driver; this worker belongs to an older one and stops")
    with pytest.raises(FencedWriterError, match=f"^{re.escape(expected)}$"):
        old.maintain_leases()
    assert {owner for owner, _, _ in store.interval_owners(NAME).values()} == {None}

    store.register(NAME, 2)
    last = worker(store, 2, clock)
    last.maintain_leases()
    publish(store, 3, 80, 120, 2_000)
    run_until_idle(last)
    assert counts(store) == dict(Counter(WORDS))
    store.close()
