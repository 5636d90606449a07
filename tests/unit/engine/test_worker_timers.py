"""engine/worker.py: a worker looks for due timers only in the computations whose intervals may
hold one (``Worker.timed``): an interval it claimed that held a timer, or one of its own commits
that set one. A pass of a computation that sets no timer sends no timer query, and every timer
still fires once its watermark passes, on whichever worker holds its interval, on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by
from headrace.engine.batch import Production
from headrace.engine.worker import Worker
from headrace.names import CONTINUOUS, id_prefix
from headrace.names import interval as interval_producer
from headrace.plans import interval_plans as plans_of, producers_of
from headrace.store import Store, open_store

from .test_worker import Clock, run_until_idle

SHARDS = 2
LEASE_MS = 1_000
INJECTOR = "inject:words"


class Reminder(Computation):
    """A record whose value says ``remind`` sets a watermark timer 50 ms after it; a firing is produced."""

    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value.get("remind"):
            ctx.set_timer("remind", record.timestamp + 50)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("reminded", {"word": ctx.key, "at": timer.timestamp})


def topology() -> Topology:
    t = Topology("reminders")
    t.inject("words", injectors.records([], timestamp="ts"))
    t.add(Reminder, inputs={"words": key_by("word")}, outputs=["reminded"], shards=SHARDS)
    return t


@pytest.fixture
def store(each_store: str) -> Any:
    db = open_store(each_store)
    t = topology()
    db.register("Reminder", SHARDS)
    for stream in t.streams():
        db.declare_stream(stream, *producers_of(t, stream, CONTINUOUS))
    yield db
    db.close()


class CountingStore:
    """The real store, with its due-timer queries counted."""

    def __init__(self, store: Store) -> None:
        self._store, self.due_queries = store, 0

    def due_timer_shards(self, *args: Any) -> Any:
        self.due_queries += 1
        return self._store.due_timer_shards(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def publish(store: Store, batch: int, words: list[tuple[str, int, bool]], watermark: int) -> None:
    prefix = id_prefix(INJECTOR, batch)
    records = [Production("words", None, {"word": w, "ts": ts, "remind": remind}, ts, f"{prefix}{n}")
               for n, (w, ts, remind) in enumerate(words)]
    store.publish(INJECTOR, batch, {"words": records}, watermark, str(batch))


def reminded(store: Store) -> list[tuple[str, int]]:
    return sorted((r.value["word"], r.value["at"]) for s in range(SHARDS)
                  for _, r in store.read_segments("reminded", interval_producer("Reminder", s), 0, 1 << 30))


def test_no_timer_query_until_a_commit_sets_a_timer_then_it_fires_once(store: Store) -> None:
    clock, counted = Clock(), CountingStore(store)
    worker = Worker(counted, plans_of(topology()), "worker-a", 0, 1, lease_ms=LEASE_MS, clock=clock)  # type: ignore[arg-type]
    worker.maintain_leases()
    assert set(worker.owned["Reminder"]) == set(range(SHARDS))
    publish(store, 1, [("a", 100, False), ("b", 110, False)], 200)
    run_until_idle(worker)
    assert (worker.timed, counted.due_queries) == (set(), 0), "no interval holds a timer: nothing to look for"

    publish(store, 2, [("a", 300, True)], 300)  # sets a timer at 350
    run_until_idle(worker)
    assert worker.timed == {"Reminder"}
    assert reminded(store) == []
    publish(store, 3, [("b", 400, False)], 400)  # the watermark passes 350
    run_until_idle(worker)
    assert counted.due_queries > 0
    assert reminded(store) == [("a", 350)]


def test_a_worker_that_claims_an_interval_holding_a_timer_looks_for_it(store: Store) -> None:
    clock = Clock()
    first = Worker(store, plans_of(topology()), "worker-a", 0, 1, lease_ms=LEASE_MS, clock=clock)
    first.maintain_leases()
    publish(store, 1, [("a", 300, True), ("b", 310, False)], 300)
    run_until_idle(first)
    assert reminded(store) == []

    clock.now += 3 * LEASE_MS  # the first worker stopped renewing: its leases lapse
    counted = CountingStore(store)
    second = Worker(counted, plans_of(topology()), "worker-b", 0, 1, lease_ms=LEASE_MS, clock=clock)  # type: ignore[arg-type]
    second.maintain_leases()
    assert set(second.owned["Reminder"]) == set(range(SHARDS))
    assert second.timed == {"Reminder"}, "a claimed interval holds a timer"
    publish(store, 2, [("b", 400, False)], 400)
    run_until_idle(second)
    assert counted.due_queries > 0
    assert reminded(store) == [("a", 350)]
