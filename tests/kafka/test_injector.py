"""injectors.kafka against a real broker: offsets as resume state, new partitions, read_committed,
watermarks, the idle-partition policy, deserializers and dead letters."""

from __future__ import annotations

import importlib
import json
import threading
import time
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer

from headrace import injectors
from headrace.errors import OptionError
from headrace.injectors import InjectedBatch
from headrace.injectors.kafka import late_records
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME


class Clock:
    """A clock the test moves (``step``: ms it moves by itself on each reading)."""

    def __init__(self, now: int = 1_000_000, step: int = 0):
        self.now, self.step = now, step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


def produce(broker: Any, topic: str, items: list[tuple[int, bytes, int]]) -> None:
    """(partition, value, Kafka timestamp) each."""
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True})  # in order
    failed: list[Any] = []
    for partition, value, ts in items:
        producer.produce(topic, value, partition=partition, timestamp=ts,
                         on_delivery=lambda error, message: failed.append(error) if error else None)
    assert producer.flush(30) == 0 and failed == []


def take(batches: Iterator[InjectedBatch], until: Any, limit: int = 400) -> list[InjectedBatch]:
    out: list[InjectedBatch] = []
    for batch in batches:
        out.append(batch)
        if until(out) or len(out) >= limit:
            return out
    return out


def values(batches: list[InjectedBatch]) -> list[Any]:
    return [v for b in batches for v, _, _ in b.records]


def test_offsets_are_the_resume_state_and_bad_records_are_dead_letters(kafka_broker: Any) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    produce(kafka_broker, topic, [(i % 2, json.dumps({"n": i}).encode(), 1_000 + i) for i in range(10)]
            + [(0, b"{not json", 2_000)])
    source = injectors.kafka(topic, kafka_broker.bootstrap_servers, bounded=True)
    first = take(source.batches(None), lambda got: len(values(got)) >= 4)
    seen = values(first)
    rest = list(source.batches(first[-1].checkpoint))  # a restart from the last published batch
    assert sorted(v["n"] for v in seen + values(rest)) == list(range(10))  # no loss, no duplicate
    assert rest[-1].watermark == END_OF_TIME
    ids = [rid for b in first + rest for _, _, rid in b.records]
    assert len(set(ids)) == 10 and all(rid.startswith(f"kafka:{topic}:") for rid in ids)
    assert [ts for b in first + rest for v, ts, _ in b.records if v["n"] == 3] == [1_003]  # Kafka's timestamp
    letters = [d for b in first + rest for d in b.dead_letters]
    assert len(letters) == 1
    letter, ts, rid = letters[0]
    assert (letter["partition"], letter["value"], ts) == (0, b"{not json", 2_000)
    assert letter["error"].startswith("JSONDecodeError") and rid == f"kafka:{topic}:0:5"


def test_a_partition_added_while_running_is_read_from_its_first_offset(kafka_broker: Any) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    produce(kafka_broker, topic, [(0, b"a", 1)])
    clock = Clock(step=10)  # looks again for new partitions every 100 readings
    batches = injectors.kafka(topic, kafka_broker.bootstrap_servers, deserializer="utf-8", discover_ms=1_000,
                              clock=clock).batches(None)
    got = take(batches, lambda got: values(got) == ["a"])
    kafka_broker.add_partitions(topic, 2)
    produce(kafka_broker, topic, [(1, b"b", 2), (1, b"c", 3)])
    got += take(batches, lambda new: len(values(new)) >= 2)
    assert values(got) == ["a", "b", "c"]
    assert json.loads(got[-1].checkpoint)["partitions"]["1"][0] == 2


def test_a_partition_added_while_running_holds_the_watermark_before_it_passes_its_records(kafka_broker: Any) -> None:
    """Partition 1 is added and written (ts 1,500) before the part reads a newer record of
    partition 0 (ts 2,000). The part looks for new partitions before its watermark passes what it
    read, whatever ``discover_ms``: partition 1's record is not late. (Waiting for the next periodic
    look, the watermark stood at 2,000 first; a CI chaos run with a driver kill right after the
    partition was added lost 12 records.)"""
    topic = kafka_broker.create_topic(partitions=1)
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 1_000}).encode(), 0)])
    clock = Clock(step=10)  # the periodic look comes again after 200 readings: too late
    batches = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", discover_ms=2_000,
                              clock=clock).batches(None)
    got = take(batches, lambda got: len(values(got)) == 1)
    kafka_broker.add_partitions(topic, 2)
    produce(kafka_broker, topic, [(1, json.dumps({"ts": 1_500}).encode(), 0)])
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 2_000}).encode(), 0)])
    got += take(batches, lambda new: len(values(new)) == 2)
    assert sorted(v["ts"] for v in values(got)) == [1_000, 1_500, 2_000]
    assert late_records(got[-1].checkpoint) == 0
    assert all(ts >= b.watermark for b in got for _, ts, _ in b.records)


def test_a_record_is_injected_when_it_comes_not_when_poll_s_is_out(kafka_broker: Any) -> None:
    """``poll_s`` is how long a part with nothing to read waits: a record that comes meanwhile is
    injected at once (librdkafka's batch call, used before, waited out the whole timeout unless
    its batch of ``batch_size`` filled, and a lone record waited all of ``poll_s``)."""
    topic = kafka_broker.create_topic()
    produce(kafka_broker, topic, [(0, b"lone", 0)])
    batches = injectors.kafka(topic, kafka_broker.bootstrap_servers, deserializer="utf-8", poll_s=20).batches(None)
    began = time.monotonic()
    got = take(batches, lambda got: values(got) == ["lone"])
    assert values(got) == ["lone"] and time.monotonic() - began < 10  # not the 20 s of poll_s


def test_the_watermark_moves_while_a_backlog_is_read_whatever_discover_ms(kafka_broker: Any) -> None:
    """A look for new partitions begun after a read lets the watermark pass it: the watermark moves
    look by look through a backlog (with ``discover_ms=0`` too, a look asked every pass), not only
    once it is drained, and never past what was read when the latest look began."""
    topic = kafka_broker.create_topic()
    n = 20_000
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 1_000 + i}).encode(), 0) for i in range(n)])
    part = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", batch_size=5, discover_ms=0,
                           clock=Clock(step=10_000))
    read, began_at = [0], [0]  # records read so far; how many when the latest look began
    take_one, mine = part._take, part._mine  # type: ignore[union-attr]

    def counted(*args: Any) -> None:
        read[0] += 1
        take_one(*args)

    def marked() -> list[int]:
        began_at[0] = read[0]
        return mine()

    part._take, part._mine = counted, marked  # type: ignore[union-attr]
    got = []
    for batch in part.batches(None):
        got.append((batch.watermark, read[0], began_at[0]))
        if read[0] == n:
            break
    marks = [mark for mark, _, _ in got]
    assert marks == sorted(marks) and len({m for m, k, _ in got if k < n}) >= 5, marks[::100]
    # a single partition without max_delay_ms: a watermark of 1,000 + k - 1 passes the first k records
    assert all(mark <= 1_000 + began - 1 for mark, _, began in got if mark > BEGINNING_OF_TIME)
    assert any(mark < 1_000 + k - 1 for mark, k, _ in got)  # it did wait for looks


def test_records_do_not_wait_for_a_look_for_new_partitions_and_the_watermark_does(kafka_broker: Any) -> None:
    """The looks run on a thread of their own: while one is under way (held here at a gate), the
    part injects what it reads with the watermark where it was; once the look is answered the
    watermark passes what was read before it began."""
    topic = kafka_broker.create_topic()
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 1_000 + i}).encode(), 0) for i in range(3)])
    part = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", clock=Clock(step=10))
    gate, looking, mine, calls = threading.Event(), threading.Event(), part._mine, []  # type: ignore[union-attr]

    def gated() -> list[int]:
        calls.append(threading.current_thread().name)
        if len(calls) > 1:  # the first look, at the start, assigns the partitions; the next wait at the gate
            looking.set()
            gate.wait(30)
        return mine()

    part._mine = gated  # type: ignore[union-attr]
    batches = part.batches(None)
    try:
        got = take(batches, lambda got: len(values(got)) == 3)
        assert looking.wait(10) and not gate.is_set()
        assert [v["ts"] for v in values(got)] == [1_000, 1_001, 1_002]
        assert {b.watermark for b in got} == {BEGINNING_OF_TIME}  # injected while the look is under way
        gate.set()
        got += take(batches, lambda got: got[-1].watermark >= 1_002)
        assert got[-1].watermark == 1_002 and not got[-1].records
        assert calls[1].startswith("headrace-kafka-look-")
    finally:
        gate.set()
        batches.close()


@pytest.mark.timeout(120)
def test_the_watermark_never_moves_back_when_a_partition_wakes_while_a_look_is_under_way(
        kafka_broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both partitions go idle, so the watermark would go to partition 0's 8,900, and the look that
    asks for is held at a gate; then partition 1 wakes with a record of 600. That look covers 8,900
    but began before the wake-up: its answer must not publish 8,900 and the next 500 (a watermark
    moving back); the part publishes 500 once a look begun after the wake-up answers. (The look
    after the held one waits until the part took the held one's answer, which a faster second
    answer would otherwise replace.)"""
    topic = kafka_broker.create_topic(partitions=2)
    clock = Clock()
    part = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", max_delay_ms=100,
                           idle_ms=5_000, clock=clock)
    gate, armed, looking, taken = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    after_held = threading.Event()
    mine = part._mine  # type: ignore[union-attr]
    looker = importlib.import_module("headrace.injectors.kafka")._Looker
    answer = looker.answer

    def noting(self: Any) -> Any:
        got = answer(self)
        if got is not None and gate.is_set():
            taken.set()
        return got

    def gated() -> list[int]:
        if armed.is_set():  # the first look asked after the clock moved (nothing else asks then)
            armed.clear()
            after_held.set()
            looking.set()
            gate.wait(30)
        elif after_held.is_set():
            after_held.clear()
            taken.wait(30)
        return mine()

    monkeypatch.setattr(looker, "answer", noting)
    part._mine = gated  # type: ignore[union-attr]
    batches = part.batches(None)
    try:
        produce(kafka_broker, topic, [(0, json.dumps({"ts": 1_000}).encode(), 0),
                                      (1, json.dumps({"ts": 500}).encode(), 0)])
        got = take(batches, lambda got: len(values(got)) == 2 and got[-1].watermark == 400)
        produce(kafka_broker, topic, [(0, json.dumps({"ts": 9_000}).encode(), 0)])
        got += take(batches, lambda new: len(values(new)) == 1)
        armed.set()
        clock.now += 5_000  # both silent for idle_ms: 8,900 waits for a look

        def wake() -> None:  # partition 1 wakes once that look is held (the part reads on meanwhile)
            if looking.wait(30):
                produce(kafka_broker, topic, [(1, json.dumps({"ts": 600}).encode(), 0)])

        waker = threading.Thread(target=wake)
        waker.start()
        got += take(batches, lambda new: len(values(new)) == 1)
        waker.join()
        assert looking.is_set() and not gate.is_set()
        gate.set()
        got += take(batches, lambda new: new[-1].watermark >= 500)
        marks = [b.watermark for b in got]
        assert marks == sorted(marks) and marks[-1] == 500 and 8_900 not in marks, marks
    finally:
        gate.set()
        taken.set()
        batches.close()


def test_records_of_aborted_transactions_are_never_injected(kafka_broker: Any) -> None:
    topic = kafka_broker.create_topic()
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    for word, commit in (("kept", True), ("aborted", False), ("also kept", True)):
        producer.begin_transaction()
        producer.produce(topic, word.encode())
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    got = list(injectors.kafka(topic, kafka_broker.bootstrap_servers, deserializer="utf-8", bounded=True).batches(None))
    assert values(got) == ["kept", "also kept"]


def test_an_idle_partition_stops_holding_the_watermark_and_its_late_records_are_counted(kafka_broker: Any) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    clock = Clock()
    source = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", max_delay_ms=100,
                             idle_ms=5_000, clock=clock)
    batches = source.batches(None)
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 1_000}).encode(), 0), (1, json.dumps({"ts": 500}).encode(), 0)])
    # the watermark may come a batch after the records (it waits for a look for new partitions)
    got = take(batches, lambda got: len(values(got)) == 2 and got[-1].watermark > BEGINNING_OF_TIME)
    assert got[-1].watermark == 400  # the slower partition's newest, less max_delay_ms
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 9_000}).encode(), 0)])
    got = take(batches, lambda got: len(values(got)) == 1)
    assert got[-1].watermark == 400  # partition 1 is not idle yet: it holds the watermark
    clock.now += 5_000  # partition 1 has been silent for idle_ms (partition 0 too)
    got = take(batches, lambda got: got[-1].watermark > 400)
    assert got[-1].watermark == 8_900 and got[-1].records == []
    produce(kafka_broker, topic, [(1, json.dumps({"ts": 600}).encode(), 0)])  # partition 1 wakes, far behind
    got = take(batches, lambda got: len(values(got)) == 1)
    assert values(got) == [{"ts": 600}] and got[-1].watermark == 8_900  # injected, never moves the mark back
    assert late_records(got[-1].checkpoint) == 1


def test_a_partition_behind_is_not_idle_however_long_it_was_silent(kafka_broker: Any) -> None:
    """Every reading of the clock here is past ``idle_ms``, as when a partition's first fetch comes a
    second after another's: a partition with records not read yet must still hold the watermark, so
    none of its records is late, whichever partition the consumer reads first."""
    topic = kafka_broker.create_topic(partitions=2)
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 1_000 + i}).encode(), 0) for i in range(5)]
            + [(1, json.dumps({"ts": ts}).encode(), 0) for ts in (500, 501, 502, 503, 2_000)])
    source = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", batch_size=1, idle_ms=1_000,
                             clock=Clock(step=10_000))
    got = take(source.batches(None), lambda got: len(values(got)) == 10)
    assert sorted(v["ts"] for v in values(got)) == [500, 501, 502, 503, *range(1_000, 1_005), 2_000]
    assert late_records(got[-1].checkpoint) == 0
    assert all(ts >= b.watermark for b in got for _, ts, _ in b.records)


def test_a_partition_read_to_its_end_that_got_records_since_is_not_idle(kafka_broker: Any) -> None:
    """Partition 1 was read to its end (empty) and stays silent past ``idle_ms``; then records
    reach it and partition 0. The end-of-partition event is older than those records, which
    ``consume`` may hand out after partition 0's: partition 1 must hold the watermark until they
    are read, so none of them is late, whichever order they come in."""
    topic = kafka_broker.create_topic(partitions=2)
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 100}).encode(), 0)])
    batches = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", batch_size=1, idle_ms=1_000,
                              clock=Clock(step=10_000)).batches(None)
    got = take(batches, lambda got: len(values(got)) == 1)
    # partition 0's first: the consumer's prefetch hands them out before partition 1's, whose
    # end-of-partition event is from when it was empty
    produce(kafka_broker, topic, [(0, json.dumps({"ts": 1_000 + i}).encode(), 0) for i in range(5)])
    produce(kafka_broker, topic, [(1, json.dumps({"ts": ts}).encode(), 0) for ts in (500, 501, 502, 503, 2_000)])
    got += take(batches, lambda new: len(values(new)) == 10)
    assert sorted(v["ts"] for v in values(got)) == [100, 500, 501, 502, 503, *range(1_000, 1_005), 2_000]
    assert late_records(got[-1].checkpoint) == 0


@pytest.mark.timeout(120)
def test_a_transactional_partition_read_to_its_end_becomes_idle(kafka_broker: Any) -> None:
    """Partition 0 is written in a transaction: its commit marker stands after its one record, so
    the broker's end is past the record's offset + 1 for good. Read to its end and silent, it must
    still stop holding the watermark."""
    topic = kafka_broker.create_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, json.dumps({"ts": 100}).encode(), partition=0)
    producer.commit_transaction(30)
    batches = injectors.kafka(topic, kafka_broker.bootstrap_servers, timestamp="ts", batch_size=1, idle_ms=1_000,
                              clock=Clock(step=10_000)).batches(None)
    got = take(batches, lambda got: len(values(got)) == 1)
    produce(kafka_broker, topic, [(1, json.dumps({"ts": 6_000 + i}).encode(), 0) for i in range(50)])
    # the watermark waits for a look begun after the last read (a stall shows as this test's timeout)
    got = take(batches, lambda got: len(values(got)) == 50 and got[-1].watermark >= 6_049)
    assert got[-1].watermark == 6_049  # partition 0 is idle: partition 1's newest


@pytest.mark.parametrize("deserializer, raw, expected", [
    ("bytes", b"\x00\x01", b"\x00\x01"), ("utf-8", "zeitgeist".encode(), "zeitgeist"),
    ("json", b'{"q": 1}', {"q": 1}), (lambda raw: raw[::-1], b"abc", b"cba")])
def test_deserializers(kafka_broker: Any, deserializer: Any, raw: bytes, expected: Any) -> None:
    topic = kafka_broker.create_topic()
    produce(kafka_broker, topic, [(0, raw, 5)])
    got = list(injectors.kafka(topic, kafka_broker.bootstrap_servers, deserializer=deserializer, bounded=True)
               .batches(None))
    assert values(got) == [expected]


def test_bad_options_are_refused_with_a_hint() -> None:
    with pytest.raises(OptionError, match=r"^Unknown Kafka deserializer \(got 'avro'\)\. Hint: use deserializer="
                                          r"'bytes', 'utf-8', 'json' or a function of the value's bytes$"):
        injectors.kafka("t", "127.0.0.1:9092", deserializer="avro")
    with pytest.raises(OptionError, match=r"^injectors\.kafka\(\)'s idle_ms must be an integer >= 1 \(got 0\)\. "
                                          r"Hint: e\.g\. idle_ms=1000$"):
        injectors.kafka("t", "127.0.0.1:9092", idle_ms=0)
    with pytest.raises(OptionError, match=r"^injectors\.kafka\(\)'s poll_s must be a number of seconds in \(0, 60\] "
                                          r"\(got '1'\)\. Hint: e\.g\. poll_s=0\.05$"):
        injectors.kafka("t", "127.0.0.1:9092", poll_s="1")


def test_a_single_part_kafka_injector_publishes_as_the_stream_itself() -> None:
    """One part is a plain injector (producer ``inject:<stream>``), not a part list: the topology
    once took its partition count for a list of parts and failed to start."""
    from headrace import Topology

    t = Topology("single")
    t.inject("events", injectors.kafka("events", "127.0.0.1:9"))
    t.inject("more", injectors.kafka("more", "127.0.0.1:9", parts=2))
    assert t.injections["events"].producers == ["inject:events"]
    assert t.injections["more"].producers == ["inject:more/0", "inject:more/1"]


class Counted(injectors.Injector):
    """An injector's batches, counted as its runner takes them."""

    def __init__(self, inner: injectors.Injector):
        self.inner, self.yielded = inner, 0

    def batches(self, resume: str | None) -> Iterator[InjectedBatch]:
        for batch in self.inner.batches(resume):
            self.yielded += 1
            yield batch


def test_a_stopped_run_ends_its_quiet_part_which_publishes_nothing_while_quiet(kafka_broker: Any,
                                                                                tmp_path: Any) -> None:
    """A part with nothing new yields an empty batch every second, which its runner's thread
    (``spark/injectors.InjectorThread``) does not publish (nothing in it differs from the last
    published batch); so the thread sees that its run stopped, and ends the part (its consumers
    closed in its ``finally``). Before, a quiet part never yielded,
    and a stopped run's thread waited inside it, polling the broker, for as long as the process lived."""
    from headrace.engine.routing import EMPTY_PLAN
    from headrace.spark.injectors import InjectorThread
    from headrace.store import open_store

    topic = kafka_broker.create_topic(partitions=1)
    produce(kafka_broker, topic, [(0, b'{"n": 1}', 1_000)])
    url, errors = f"sqlite:///{tmp_path}/store.db", []
    part = Counted(injectors.kafka(topic, kafka_broker.bootstrap_servers))
    store = open_store(url)  # made first, as the driver makes it before its injectors start
    thread = InjectorThread("events", "inject:events", part, url, errors.append, None, EMPTY_PLAN)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while thread.watermark < 1_000:  # polling for a state: the record read, and its watermark published
            assert time.monotonic() < deadline and errors == [], errors
            time.sleep(0.05)
        journaled, yielded = store.latest_batch("inject:events").batch, part.yielded
        while part.yielded < yielded + 2:  # two quiet batches
            assert time.monotonic() < deadline + 10 and errors == [], errors
            time.sleep(0.05)
        assert store.latest_batch("inject:events").batch == journaled
        thread.stop()
        thread.join(15)
        assert not thread.is_alive(), "the stopped run's injector thread still waits inside its quiet part"
        assert errors == [] and thread.published == 1 and part.inner._asker is None  # its finally ran
    finally:
        thread.stop()
        store.close()
