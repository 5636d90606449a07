"""spark/source.py: the ``headrace`` source's offsets, partitions and reads, on a real SQLite store,
with the options the runner passes (``ComputationQuery.start``); no SparkSession needed."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest

from headrace import Computation, key_by
from headrace.engine import Production, ShardCommit
from headrace.engine.batch import DueTimer
from headrace.engine.intake import Consumer
from headrace.model import BEGINNING_OF_TIME, ComputationOptions
from headrace.spark import source
from headrace.spark.rows import CONTROL, RECORD
from headrace.spark.source import HeadraceReader, ReadPart, encode_plan
from headrace.store import Store, open_store

EVENTS, CLICKS = "inject:events", "inject:clicks"
SUBSCRIPTIONS = [("events", EVENTS), ("clicks", CLICKS)]
SHARDS = 2

MakeReader = Callable[..., HeadraceReader]


class Counter(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    s = open_store(url)
    yield s
    s.close()


@pytest.fixture
def make_reader(url: str) -> Iterator[MakeReader]:
    readers: list[HeadraceReader] = []

    def make(start: str = "beginning", parallelism: int = 2,
             subscriptions: list[tuple[str, str]] = SUBSCRIPTIONS) -> HeadraceReader:
        consumer = Consumer("Counter", ComputationOptions(shards=SHARDS),
                            {stream: key_by("user") for stream, _ in subscriptions},
                            {stream: (producer,) for stream, producer in subscriptions})
        reader = HeadraceReader({"store": url, "plan": encode_plan(consumer, Counter), "start": start,
                                 "parallelism": str(parallelism)})
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        reader.stop()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The source's wall clock, in milliseconds, set by the test."""
    now = SimpleNamespace(ms=0)
    monkeypatch.setattr(source, "time", SimpleNamespace(time=lambda: now.ms / 1000, monotonic=time.monotonic))
    return now


def publish(store: Store, producer: str, batch: int, watermark: int, users: tuple[str, ...] = ("ana", "bo")) -> None:
    stream = producer.removeprefix("inject:")
    store.publish(producer, batch, {stream: [
        Production(stream, None, {"user": user, "batch": batch}, watermark + i, f"{producer}:{batch}:{i}")
        for i, user in enumerate(users)]}, watermark)


def offset(events: int, clicks: int, wall: int = 0) -> dict[str, Any]:
    return {"b": {CLICKS: clicks, EVENTS: events}, "wall": wall}


def set_timer(store: Store, computation: str, domain: str, timestamp: int, tag: str = "t") -> None:
    """A timer set the way the engine sets one: through a shard commit."""
    store.register(computation, SHARDS)
    version = store.shard_versions(computation)[0]
    store.commit_shard(ShardCommit(computation, 0, version + 1, version, store.acquire_writer(computation),
                                   timer_sets=[DueTimer("k", tag, domain, timestamp)]))


# -- initialOffset -------------------------------------------------------------------------------

def test_initial_offset_from_the_beginning(store: Store, make_reader: MakeReader) -> None:
    publish(store, EVENTS, 1, 10)
    assert make_reader("beginning").initialOffset() == offset(0, 0)


def test_initial_offset_now_starts_after_every_completed_batch(store: Store, make_reader: MakeReader) -> None:
    for batch in (1, 2, 3):
        publish(store, EVENTS, batch, batch * 10)
    assert make_reader("now").initialOffset() == offset(3, 0)


@pytest.mark.parametrize("start, expected", [
    ("500", offset(0, 0)),    # before everything: replay it all
    ("2000", offset(1, 1)),   # batch 2 completed at 2000 is replayed
    ("2001", offset(2, 1)),
    ("9000", offset(3, 1)),   # after everything: nothing to replay
])
def test_initial_offset_from_a_time_replays_batches_completed_at_or_after_it(
        url: str, make_reader: MakeReader, start: str, expected: dict[str, Any]) -> None:
    completed_at = SimpleNamespace(ms=0)
    stamped = open_store(url, clock=lambda: completed_at.ms)  # the store stamps completed_at with its clock
    for producer, batch, at in [(EVENTS, 1, 1000), (CLICKS, 1, 1500), (EVENTS, 2, 2000), (EVENTS, 3, 3000)]:
        completed_at.ms = at
        publish(stamped, producer, batch, at)
    stamped.close()
    assert make_reader(start).initialOffset() == expected


# -- latestOffset --------------------------------------------------------------------------------

def test_latest_offset_stays_put_while_nothing_happens(store: Store, make_reader: MakeReader,
                                                        clock: SimpleNamespace) -> None:
    reader = make_reader()
    clock.ms = 1_000_000
    start = reader.initialOffset()
    assert reader.latestOffset(start, None) == start
    publish(store, EVENTS, 1, 10)
    moved = reader.latestOffset(start, None)
    clock.ms = 2_000_000
    assert reader.latestOffset(moved, None) == moved


def test_latest_offset_moves_when_a_producer_completes_a_batch(store: Store, make_reader: MakeReader,
                                                               clock: SimpleNamespace) -> None:
    reader = make_reader()
    start = reader.initialOffset()
    publish(store, EVENTS, 1, 10)
    assert reader.latestOffset(start, None) == offset(1, 0)
    publish(store, CLICKS, 1, 10)
    publish(store, CLICKS, 2, 20)
    assert reader.latestOffset(offset(1, 0), None) == offset(1, 2)
    store.publish(EVENTS, 2, {}, 30)  # a batch that only moves the watermark moves the offset too
    assert reader.latestOffset(offset(1, 2), None) == offset(2, 2)


def test_latest_offset_never_moves_back(store: Store, make_reader: MakeReader, clock: SimpleNamespace) -> None:
    publish(store, EVENTS, 1, 10)
    assert make_reader().latestOffset(offset(5, 0, wall=7), None) == offset(5, 0, wall=7)


def test_latest_offset_moves_when_a_wall_timer_of_the_consumer_falls_due(store: Store, make_reader: MakeReader,
                                                                         clock: SimpleNamespace) -> None:
    reader = make_reader()
    start = reader.initialOffset()
    set_timer(store, "Counter", "wall", 50_000)
    set_timer(store, "Counter", "watermark", 1_000, tag="w")  # event time: not the wall clock's business
    set_timer(store, "Other", "wall", 20_000)  # another computation's timer

    clock.ms = 30_000
    assert reader.latestOffset(start, None) == start
    clock.ms = 50_000
    fired = reader.latestOffset(start, None)
    assert fired == offset(0, 0, wall=50_000)
    clock.ms = 60_000  # the same timer, not yet deleted by the consumer's batch, does not move it again
    assert reader.latestOffset(fired, None) == fired

    set_timer(store, "Counter", "wall", 70_000)  # replaces timer "t"
    clock.ms = 80_000
    assert reader.latestOffset(fired, None) == offset(0, 0, wall=80_000)


# -- partitions ----------------------------------------------------------------------------------

def covered(parts: list[ReadPart], producer: str | None = None) -> list[int]:
    return [b for p in parts for r in p.ranges if producer in (None, r.producer) for b in range(r.after + 1, r.upto + 1)]


@pytest.mark.parametrize("parallelism", [1, 2, 3, 4, 8])
def test_partitions_cover_exactly_the_new_batches_in_at_most_parallelism_ranges(
        store: Store, make_reader: MakeReader, parallelism: int) -> None:
    for batch in range(1, 8):
        publish(store, EVENTS, batch, batch * 10)
    reader = make_reader(parallelism=parallelism, subscriptions=[("events", EVENTS)])
    for first in range(0, 8):
        for last in range(first + 1, 8):
            parts = reader.partitions({"b": {EVENTS: first}, "wall": 0}, {"b": {EVENTS: last}, "wall": 0})
            assert all(isinstance(p, ReadPart) and [r.producer for r in p.ranges] == [EVENTS] for p in parts)
            assert covered(parts) == list(range(first + 1, last + 1)), (first, last)
            assert 1 <= len(parts) <= parallelism


def test_each_subscription_gets_its_own_ranges(store: Store, make_reader: MakeReader) -> None:
    for batch in range(1, 8):
        publish(store, EVENTS, batch, batch * 10)
    for batch in range(1, 4):
        publish(store, CLICKS, batch, batch * 10 + 5)
    parts = make_reader(parallelism=2).partitions(offset(1, 0), offset(7, 3, wall=99))
    events = [p for p in parts if p.ranges[0].producer == EVENTS]
    clicks = [p for p in parts if p.ranges[0].producer == CLICKS]
    assert (covered(events), covered(clicks)) == ([2, 3, 4, 5, 6, 7], [1, 2, 3])
    assert len(events) <= 2 and len(clicks) <= 2 and len(parts) == len(events) + len(clicks)


def test_the_control_row_carries_watermarks_derived_from_the_offsets(store: Store, make_reader: MakeReader) -> None:
    for batch in range(1, 8):
        publish(store, EVENTS, batch, batch * 10)
    for batch in range(1, 4):
        publish(store, CLICKS, batch, batch * 10 + 5)
    reader = make_reader()

    parts = reader.partitions(offset(1, 0), offset(7, 3, wall=99))
    # before: clicks had completed nothing, so nothing bounds its input yet from below
    assert parts[0].control == (BEGINNING_OF_TIME, min(70, 35), 99)
    assert [p.control for p in parts[1:]] == [None] * (len(parts) - 1)

    later = reader.partitions(offset(3, 1), offset(4, 3, wall=5))
    assert later[0].control == (min(30, 15), min(40, 35), 5)


def test_a_batch_with_only_a_wall_clock_move_is_one_control_partition(store: Store, make_reader: MakeReader) -> None:
    publish(store, EVENTS, 1, 10)
    publish(store, CLICKS, 1, 20)
    reader = make_reader()
    assert reader.partitions(offset(1, 1), offset(1, 1)) == []
    assert reader.partitions(offset(1, 1), offset(1, 1, wall=500)) == [ReadPart([], [], 10, (10, 10, 500))]


# -- reading -------------------------------------------------------------------------------------

def read_all(reader: HeadraceReader, start: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for partition in reader.partitions(start, end) for rb in reader.read(partition)
            for row in rb.to_pylist()]


def test_a_read_yields_the_batches_records_keyed_and_one_control_row_per_shard(store: Store,
                                                                                make_reader: MakeReader) -> None:
    publish(store, EVENTS, 1, 10, users=("old",))
    publish(store, EVENTS, 2, 20, users=("ana", "bo"))
    publish(store, EVENTS, 3, 30, users=("cy",))
    publish(store, CLICKS, 1, 15, users=("dee",))
    rows = read_all(make_reader(), offset(1, 0), offset(3, 1, wall=7))
    controls = [r for r in rows if r["kind"] == CONTROL]
    assert [(r["shard"], r["wm_before"], r["wm_after"], r["wall"]) for r in controls] == [
        (s, BEGINNING_OF_TIME, 15, 7) for s in range(SHARDS)]
    records = sorted((r["stream"], r["key"], r["id"]) for r in rows if r["kind"] == RECORD)
    assert records == [("clicks", "dee", "inject:clicks:1:0"), ("events", "ana", "inject:events:2:0"),
                       ("events", "bo", "inject:events:2:1"), ("events", "cy", "inject:events:3:0")]


def test_reading_the_same_offsets_twice_yields_the_same_rows(store: Store, make_reader: MakeReader,
                                                             clock: SimpleNamespace) -> None:
    for batch in range(1, 6):
        publish(store, EVENTS, batch, batch * 10, users=("ana", "bo", f"u{batch}"))
    for batch in range(1, 3):
        publish(store, CLICKS, batch, batch * 10 + 5, users=(f"c{batch}",))
    start, end = offset(1, 0), offset(5, 2, wall=40)
    first = read_all(make_reader(), start, end)
    assert len(first) == 4 * 3 + 2 * 1 + SHARDS

    # the world moves on: more batches, a wall timer; a replay after a restart reads the same rows
    for batch in range(6, 9):
        publish(store, EVENTS, batch, batch * 10)
    publish(store, CLICKS, 3, 35)
    set_timer(store, "Counter", "wall", 1)
    clock.ms = 10_000
    assert read_all(make_reader(), start, end) == first
