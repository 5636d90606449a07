"""spark/source.py: the ``headrace`` source's offsets, partitions and reads (each task runs its
shards' batch), on a real SQLite store, with the options the runner passes
(``ComputationQuery.start``) and an offset log written as Spark writes it; no SparkSession needed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest

from headrace import Computation, key_by
from headrace.engine import Production, ShardCommit
from headrace.engine.batch import DueTimer
from headrace.engine.consumer import Consumer
from headrace.model import BEGINNING_OF_TIME, ComputationOptions
from headrace.spark import source
from headrace.errors import HeadraceError, OptionError
from headrace.names import MICROBATCH, injector
from headrace.spark.source import HeadraceReader, ReadPart, ShardPlan, encode_plan
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
def checkpoint(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")


def log_offsets(checkpoint: str, *ends: dict[str, Any]) -> None:
    """Spark's offset log of batches 0, 1, ... ending at ``ends``, in Spark's file format."""
    os.makedirs(os.path.join(checkpoint, "offsets"), exist_ok=True)
    for batch_id, end in enumerate(ends):
        with open(os.path.join(checkpoint, "offsets", str(batch_id)), "w") as f:
            f.write('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n' + json.dumps(end) + "\n")


@pytest.fixture
def make_reader(url: str, store: Store, checkpoint: str) -> Iterator[MakeReader]:
    readers: list[HeadraceReader] = []

    def make(start: str = "beginning", parallelism: int = 2,
             subscriptions: list[tuple[str, str]] = SUBSCRIPTIONS) -> HeadraceReader:
        consumer = Consumer("Counter", ComputationOptions(shards=SHARDS),
                            {stream: key_by("user") for stream, _ in subscriptions},
                            {stream: (producer,) for stream, producer in subscriptions})
        store.register("Counter", SHARDS, MICROBATCH)
        plan = ShardPlan(consumer, Counter, sequencer=store.acquire_writer("Counter"))
        reader = HeadraceReader({"store": url, "plan": encode_plan(plan), "checkpoint": checkpoint, "start": start,
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

def covered(part: ReadPart, producer: str | None = None) -> list[int]:
    return [b for r in part.ranges if producer in (None, r.producer) for b in range(r.after + 1, r.upto + 1)]


@pytest.mark.parametrize("parallelism", [1, 2, 3, 4, 8])
def test_each_task_reads_exactly_the_new_batches_for_its_share_of_the_shards(
        store: Store, make_reader: MakeReader, checkpoint: str, parallelism: int) -> None:
    for batch in range(1, 8):
        publish(store, EVENTS, batch, batch * 10)
    reader = make_reader(parallelism=parallelism, subscriptions=[("events", EVENTS)])
    for first in range(0, 8):
        for last in range(first + 1, 8):
            end = {"b": {EVENTS: last}, "wall": 0}
            log_offsets(checkpoint, end)
            parts = reader.partitions({"b": {EVENTS: first}, "wall": 0}, end)
            assert all(isinstance(p, ReadPart) and covered(p) == list(range(first + 1, last + 1)) for p in parts)
            assert len(parts) == min(parallelism, SHARDS)
            assert sorted(s for p in parts for s in p.dests) == list(range(SHARDS))


def test_each_subscription_gets_its_own_ranges(store: Store, make_reader: MakeReader, checkpoint: str) -> None:
    for batch in range(1, 8):
        publish(store, EVENTS, batch, batch * 10)
    for batch in range(1, 4):
        publish(store, CLICKS, batch, batch * 10 + 5)
    log_offsets(checkpoint, offset(7, 3, wall=99))
    for part in make_reader(parallelism=2).partitions(offset(1, 0), offset(7, 3, wall=99)):
        assert (covered(part, EVENTS), covered(part, CLICKS)) == ([2, 3, 4, 5, 6, 7], [1, 2, 3])


def test_every_task_carries_the_watermarks_derived_from_the_offsets(store: Store, make_reader: MakeReader,
                                                                    checkpoint: str) -> None:
    for batch in range(1, 8):
        publish(store, EVENTS, batch, batch * 10)
    for batch in range(1, 4):
        publish(store, CLICKS, batch, batch * 10 + 5)
    reader = make_reader()
    log_offsets(checkpoint, offset(1, 0), offset(7, 3, wall=99), offset(4, 3, wall=5))

    parts = reader.partitions(offset(1, 0), offset(7, 3, wall=99))
    # before: clicks had completed nothing, so nothing bounds its input yet from below
    assert [p.control for p in parts] == [(BEGINNING_OF_TIME, min(70, 35), 99)] * SHARDS
    later = reader.partitions(offset(3, 1), offset(4, 3, wall=5))
    assert [p.control for p in later] == [(min(30, 15), min(40, 35), 5)] * SHARDS


def test_a_batch_with_only_a_wall_clock_move_runs_every_shard(store: Store, make_reader: MakeReader,
                                                              checkpoint: str) -> None:
    publish(store, EVENTS, 1, 10)
    publish(store, CLICKS, 1, 20)
    reader = make_reader()
    log_offsets(checkpoint, offset(1, 1), offset(1, 1, wall=500))
    assert reader.partitions(offset(1, 1), offset(1, 1)) == []
    producers = {"events": (EVENTS,), "clicks": (CLICKS,)}
    assert reader.partitions(offset(1, 1), offset(1, 1, wall=500)) == [  # since the empty batch 1
        ReadPart([], [0], 2, 1, (10, 10, 500), producers), ReadPart([], [1], 2, 1, (10, 10, 500), producers)]


def test_the_batch_number_is_the_logged_batch_of_its_end_offset_and_the_first_one_starts_the_routing(
        store: Store, make_reader: MakeReader, checkpoint: str) -> None:
    for batch in range(1, 4):
        publish(store, EVENTS, batch, batch * 10)
    log_offsets(checkpoint, offset(1, 0), offset(2, 0), offset(3, 0))
    reader = make_reader()
    # a restarted query replays its last logged batch first: Spark's batch id 2, headrace's batch 3
    assert {(p.batch, p.since) for p in reader.partitions(offset(2, 0), offset(3, 0))} == {(3, 3)}
    log_offsets(checkpoint, offset(1, 0), offset(2, 0), offset(3, 0), offset(3, 0, wall=9))
    assert {(p.batch, p.since) for p in reader.partitions(offset(3, 0), offset(3, 0, wall=9))} == {(4, 3)}


def test_a_source_without_its_querys_checkpoint_is_refused(url: str, store: Store) -> None:
    consumer = Consumer("Counter", ComputationOptions(shards=SHARDS), {"events": key_by("user")}, {"events": (EVENTS,)})
    reader = HeadraceReader({"store": url, "plan": encode_plan(ShardPlan(consumer, Counter))})
    with pytest.raises(OptionError, match=r"The headrace source of 'Counter' has no checkpoint option "
                                          r"\(got \['plan', 'store'\]\)\. "
                                          r"Hint: pass \.option\('checkpoint', <the query's checkpointLocation>\)"):
        reader.partitions(offset(0, 0), offset(1, 0))
    reader.stop()


def test_an_end_offset_that_spark_did_not_log_is_refused(store: Store, make_reader: MakeReader,
                                                         checkpoint: str) -> None:
    publish(store, EVENTS, 1, 10)
    log_offsets(checkpoint, offset(0, 0, wall=3))
    with pytest.raises(HeadraceError, match=r"Spark's offset log of 'Counter' has no batch that ends at "
                                            r"\{'b': \{'inject:clicks': 0, 'inject:events': 1\}, 'wall': 0\}"):
        make_reader().partitions(offset(0, 0), offset(1, 0))


# -- reading: each task runs its shards' batch ------------------------------------------------------

def read_all(reader: HeadraceReader, start: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for partition in reader.partitions(start, end) for rb in reader.read(partition)
            for row in rb.to_pylist()]


def counts(store: Store, *users: str) -> dict[str, int]:
    codec = ComputationOptions(shards=SHARDS).codec
    return {u: codec.decode(store.state("Counter", u)) for u in users if store.state("Counter", u) is not None}


def test_a_read_runs_each_shards_batch_on_the_records_of_its_keys(store: Store, make_reader: MakeReader,
                                                                  checkpoint: str) -> None:
    publish(store, EVENTS, 1, 10, users=("old",))
    publish(store, EVENTS, 2, 20, users=("ana", "bo"))
    publish(store, EVENTS, 3, 30, users=("cy",))
    publish(store, CLICKS, 1, 15, users=("dee", "ana"))
    log_offsets(checkpoint, offset(1, 0), offset(3, 1, wall=7))
    rows = read_all(make_reader(), offset(1, 0), offset(3, 1, wall=7))
    assert sorted(r["shard"] for r in rows) == list(range(SHARDS))
    assert {(r["batch"], r["outcome"], r["watermark"]) for r in rows} == {(2, "committed", 15)}
    assert sum(r["records"] for r in rows) == 5 and sum(r["rejected"] for r in rows) == 0
    assert counts(store, "old", "ana", "bo", "cy", "dee") == {"ana": 2, "bo": 1, "cy": 1, "dee": 1}


def test_a_replayed_batch_finds_its_commits_made_and_runs_no_code_again(store: Store, make_reader: MakeReader,
                                                                        checkpoint: str, clock: SimpleNamespace) -> None:
    for batch in range(1, 6):
        publish(store, EVENTS, batch, batch * 10, users=("ana", "bo", f"u{batch}"))
    for batch in range(1, 3):
        publish(store, CLICKS, batch, batch * 10 + 5, users=(f"c{batch}",))
    start, end = offset(1, 0), offset(5, 2, wall=40)
    log_offsets(checkpoint, start, end)
    first = read_all(make_reader(), start, end)
    assert sum(r["records"] for r in first) == 4 * 3 + 2 * 1
    assert {r["outcome"] for r in first} == {"committed"}

    # the world moves on: more batches, a later clock; a replay after a restart reads the same input
    for batch in range(6, 9):
        publish(store, EVENTS, batch, batch * 10)
    publish(store, CLICKS, 3, 35)
    clock.ms = 10_000
    again = read_all(make_reader(), start, end)
    assert {r["outcome"] for r in again} == {"redelivered"}
    assert [(r["shard"], r["records"]) for r in again] == [(r["shard"], r["records"]) for r in first]
    assert counts(store, "ana", "bo") == {"ana": 4, "bo": 4}


def test_a_task_reads_the_injector_parts_declared_after_its_query_started(
        store: Store, make_reader: MakeReader, checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark makes the reader that runs a task anew from the query's options: the parts the planner
    found since the query started travel with the task, or their records would be skipped."""
    seconds = SimpleNamespace(s=10.0)  # the planner looks for new parts once a second
    monkeypatch.setattr(source, "time", SimpleNamespace(time=time.time, monotonic=lambda: seconds.s))
    part = injector("events", 1)
    planner = make_reader(subscriptions=[("events", EVENTS)])
    start = planner.initialOffset()
    seconds.s += 2
    store.declare_stream("events", EVENTS, part)
    publish(store, EVENTS, 1, 10, users=("ana",))
    store.publish(part, 1, {"events": [Production("events", None, {"user": "bo"}, 11, f"{part}:1:0")]}, 11)
    end = planner.latestOffset(start, None)
    assert end["b"] == {EVENTS: 1, part: 1}
    log_offsets(checkpoint, end)
    runner = make_reader(subscriptions=[("events", EVENTS)])
    rows = [row for p in planner.partitions(start, end) for rb in runner.read(p) for row in rb.to_pylist()]
    assert sum(r["records"] for r in rows) == 2
    assert counts(store, "ana", "bo") == {"ana": 1, "bo": 1}
