"""store/retention.py on both stores, with continuous workers reading the bus (no Spark): routed
segments go once their interval read them; a stream's segments and journal go once every reader
has read them and they are older than the window, never before; a replay from before the window
is refused with the window in the message."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by
from headrace.engine.publish import publish_injected
from headrace.engine.worker import Worker
from headrace.errors import OptionError
from headrace.names import CONTINUOUS
from headrace.plans import consumer_of, interval_plans, producers_of, routing_plan
from headrace.store import open_store
from headrace.store.retention import JOURNAL_KEEP_MS

WINDOW = 1_000


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("end", 10**15)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce(f"{type(self).__name__.lower()}s", {"user": ctx.key, "n": ctx.state})


class Fast(Count):
    pass


class Slow(Count):
    pass


def topology() -> Topology:
    t = Topology("retained")
    t.inject("events", injectors.records([], timestamp="ts"))
    t.add(Fast, inputs={"events": key_by("user")}, outputs=["fasts"], shards=3)
    t.add(Slow, inputs={"events": key_by("user")}, outputs=["slows"], shards=3)
    return t


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


def open_bus(store_url: str) -> tuple[Any, Topology, Any, Clock]:
    """A store with the topology's computations registered and its bus declared and routed."""
    clock = Clock()
    store = open_store(store_url, clock=clock)
    t = topology()
    for spec in t.computations.values():
        store.register(spec.name, spec.options.shards, CONTINUOUS)
    for s in sorted(t.streams()):
        store.declare_stream(s, *producers_of(t, s, CONTINUOUS))
    plan = routing_plan(t, frozenset({"events"}))
    store.register_plan(plan.id, plan.routes)
    return store, t, plan, clock


@pytest.fixture
def bus(store_url: str) -> Any:
    opened = open_bus(store_url)
    yield opened
    opened[0].close()


def publish(store: Any, plan: Any, batch: int, clock: Clock) -> None:
    values = [{"user": f"u{(batch * 7 + i) % 5}", "ts": batch * 100 + i} for i in range(10)]
    publish_injected(store, "inject:events", batch, "events", [(v, v["ts"], None) for v in values], batch * 100, None,
                     None, plan, 1)
    clock.now += 400


def worker(store: Any, t: Topology, name: str, clock: Clock) -> Worker:
    plans = [p for p in interval_plans(t) if p.name == name]
    w = Worker(store, plans, f"worker-{name}", 0, 1, lease_ms=10**9, clock=clock)
    w.maintain_leases()
    return w


def readers(t: Topology) -> dict[str, dict[str, list[str]]]:
    return {n: {s: list(ps) for s, ps in consumer_of(t, n, CONTINUOUS).producers.items()} for n in t.computations}


def rows(store: Any, table: str, where: str = "1 = 1") -> int:
    return int(store._one(f"SELECT COUNT(*) FROM {table} WHERE {where}")[0])


def test_retention_forgets_only_what_every_reader_read_and_the_window_passed(bus: Any) -> None:
    store, t, plan, clock = bus
    fast = worker(store, t, "Fast", clock)
    for batch in range(1, 6):
        publish(store, plan, batch, clock)
        fast.step()
    # Slow has read nothing: Fast's routed segments go, the stream's segments and journal stay
    trimmed = store.trim(readers(t), {"events": WINDOW}, clock())
    assert trimmed.routes > 0 and (trimmed.segments, trimmed.batches) == (0, 0)
    assert rows(store, "routes", "consumer = 'Fast'") == 0 and rows(store, "routes", "consumer = 'Slow'") > 0
    assert rows(store, "segments", "stream = 'events'") == 5 and rows(store, "batches", "producer = 'inject:events'") == 5

    slow = worker(store, t, "Slow", clock)  # stopped for longer than the window, it catches up exactly
    slow.step()
    publish(store, plan, 6, clock)
    fast.step()
    slow.step()
    trimmed = store.trim(readers(t), {"events": WINDOW}, clock())
    # batches 1..5 were read by both and are older than the window (400 ms apart, the last 800 ms old:
    # 1..4 are past it); the head is kept, and what was read in the window too
    assert rows(store, "segments", "stream = 'events'") == 2
    assert [b.batch for b in store.batches("inject:events")] == [5, 6]
    assert rows(store, "routes") == 0
    with pytest.raises(OptionError, match=re.escape(
            "Stream 'events' of " + store.shown_url + " keeps 'inject:events' from its batch 5 on: retention (a replay "
            f"window of {WINDOW} ms) forgot its batches 1..4 (got a read from its batch 1). Hint: read from a later "
            "batch or time (start='now', or a time within the window), or run with a longer retention_ms to keep "
            "more")):
        store.check_replay("events", "inject:events", 0)
    store.check_replay("events", "inject:events", 4)  # from what is kept: fine

    for w in (fast, slow):  # the end of time: every key's count once, as in the input
        publish(store, plan, 7 if w is fast else 8, clock)
    store.publish("inject:events", 9, {}, 10**18)
    for w in (fast, slow):
        w.step()
        w.step()
    expected = Counter(f"u{(b * 7 + i) % 5}" for b in range(1, 9) for i in range(10))
    for stream in ("fasts", "slows"):
        got = {r.value["user"]: r.value["n"] for i in range(3) for _, r in
               store.read_segments(stream, f"{stream.rstrip('s').capitalize()}/{i}", 0, 99)}
        assert got == dict(expected), stream


def test_a_stream_without_a_window_keeps_its_segments_and_dead_reports_go(bus: Any) -> None:
    store, t, plan, clock = bus
    fast, slow = worker(store, t, "Fast", clock), worker(store, t, "Slow", clock)
    for batch in range(1, 4):
        publish(store, plan, batch, clock)
        fast.step()
        slow.step()
    clock.now += 10 * WINDOW
    assert store.trim(readers(t), {"events": None}, clock()).segments == 0
    assert rows(store, "segments", "stream = 'events'") == 3 and rows(store, "routes") == 0
    reports = rows(store, "interval_groups")
    fast.release_all()
    store.claim_intervals("Fast", [0, 1, 2], "another", clock(), clock() + 10**9)  # new sequencers
    assert store.trim(readers(t), {"events": None}, clock()).reports >= 1
    assert rows(store, "interval_groups") < reports


def test_the_journal_keeps_each_producers_head_its_bus_rows_and_the_monitoring_horizon(bus: Any) -> None:
    """Rows nothing reads go: the watermark authority's (one per change) and the commits of
    intervals that wrote no segment, once older than the monitoring horizon; each producer's last
    row stays, and so does every row of a batch whose segments are kept or a reader has not read."""
    store, t, plan, clock = bus
    fast = worker(store, t, "Fast", clock)
    for batch in range(1, 5):
        publish(store, plan, batch, clock)
        fast.step()
        store.complete_batch("Fast", batch, batch * 100, batch * 100)  # what the authority journals
    intervals = [f"Fast/{i}" for i in range(3)]
    before = {p: len(store.batches(p)) for p in ["Fast", *intervals, "inject:events"]}
    assert before["Fast"] == 4 and sum(before[p] for p in intervals) > 3

    store.trim(readers(t), {"events": None}, clock())
    assert {p: len(store.batches(p)) for p in before} == before, "younger than the horizon: all kept"

    clock.now += JOURNAL_KEEP_MS + 1
    trimmed = store.trim(readers(t), {"events": None}, clock())
    assert [b.batch for b in store.batches("Fast")] == [4]
    for p in intervals:  # no segment of their own (Count writes at the end of time): the head alone
        assert len(store.batches(p)) == min(1, before[p]), p
    assert trimmed.journal == sum(before.values()) - sum(len(store.batches(p)) for p in before)
    # the injector's batches keep their segments (no window) and Slow has read none of them
    assert len(store.batches("inject:events")) == before["inject:events"] == 4


def test_the_trim_deletes_in_short_steps_and_records_what_goes_before_it_goes(bus: Any, monkeypatch: Any) -> None:
    """Each DELETE covers at most ``TRIM_STEP_BATCHES`` batches (a store with one writer holds the
    pipeline back one short step at a time); a trim that dies between its steps has already
    recorded what it forgets, so a replay is refused, and the next trim finishes the job."""
    store, t, plan, clock = bus
    fast, slow = worker(store, t, "Fast", clock), worker(store, t, "Slow", clock)
    for batch in range(1, 13):
        publish(store, plan, batch, clock)
        fast.step()
        slow.step()
    clock.now += 10 * WINDOW
    monkeypatch.setattr(type(store), "TRIM_STEP_BATCHES", 3)
    deletes: list[tuple[str, tuple[Any, ...]]] = []
    steps_left = [2]
    real_x = store._x

    def counting_x(sql: str, params: Any = ()) -> Any:
        if sql.startswith("DELETE FROM segments"):
            if steps_left[0] == 0:
                raise KeyboardInterrupt("killed between two steps of the trim")
            steps_left[0] -= 1
        if sql.startswith("DELETE FROM") and "AND batch <= ?" in sql:
            deletes.append((sql, tuple(params)))
        return real_x(sql, params)

    monkeypatch.setattr(store, "_x", counting_x)
    with pytest.raises(KeyboardInterrupt):
        store.trim(readers(t), {"events": WINDOW}, clock())
    assert 0 < rows(store, "segments", "stream = 'events'") < 12, "died half way"
    with pytest.raises(OptionError, match=re.escape("forgot its batches 1..12 (got a read from its batch 1)")):
        store.check_replay("events", "inject:events", 0)

    steps_left[0] = 10**9
    store.trim(readers(t), {"events": WINDOW}, clock())
    assert rows(store, "segments", "stream = 'events'") == 0 and rows(store, "routes") == 0
    assert [b.batch for b in store.batches("inject:events")] == [12]
    spans: dict[tuple[str, tuple[Any, ...]], list[int]] = {}
    for sql, params in deletes:  # per table and reader, consecutive statements step through the batches
        spans.setdefault((sql, params[:-1]), []).append(int(params[-1]))
    for (sql, _), upto in spans.items():
        table = sql.split()[2]
        assert all(b - a <= 3 for a, b in zip(upto, upto[1:])), (table, upto)
    assert len(spans) >= 3 and max(len(u) for u in spans.values()) >= 4
