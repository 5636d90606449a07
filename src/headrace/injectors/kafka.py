"""``injectors.kafka``: a Kafka topic as an injector, on ``confluent-kafka``.

Sources as parts with resume state, as Bytewax's inputs are: the topic's partitions are dealt to
``parts`` injector parts (partition ``p`` to part ``p % parts``), and a part's resume state is the
next offset and newest timestamp of each partition it owns, journaled with each batch it publishes
in the same store transaction (``engine.publish``). So input is exactly-once without Kafka
transactions or consumer-group commits: a restarted part reads on from its last published batch.
A part looks for new partitions every ``discover_ms``, and again before its watermark passes
records it has read: a watermark computed from what was read by some moment is published once a
look begun after that moment is answered (bounded by the watermark as it stands then, so it never
moves back), and a look that finds new partitions voids those waiting.
It reads a new partition from its first offset, so a record written to a new partition before the
part read a newer one elsewhere is not late. The looks run on a thread of their own, at most every
10 ms while records come: the watermark waits for them, the records do not. A look the broker does
not answer holds the watermark until one it answers. A part with nothing new yields an empty batch
every second, which the runner does not publish: its thread sees then that its run stopped, and
the part closes its consumers.
It reads with ``isolation.level=read_committed``: records of aborted or open transactions are never
injected.

Timestamps: the record's Kafka timestamp (``timestamp=None``), or a field or function of the
decoded value. A partition's watermark is its newest timestamp less ``max_delay_ms``; the part's is
the minimum over its partitions that are not idle, and never moves back.

Idle partitions: a partition read to its end (the broker, asked then, holds nothing past what was
read) with no record for ``idle_ms`` (by ``clock``) stops holding the watermark back; when every
partition is idle the watermark is the highest of theirs. A partition with records not read yet is
behind, not idle, however long it has been silent (at the start, the first fetch of a partition can
come a second after another's). A record that then arrives behind the published watermark is late:
it is still injected (the consumers' ``late=`` option decides, and counts, what they do with it)
and the part counts it in its resume state (``late``), so none vanishes silently.

Values are decoded by ``deserializer`` (``"bytes"``, ``"utf-8"``, ``"json"`` or a function of the
bytes); a record that cannot be decoded, or that has no usable timestamp field, goes to the stream's
dead-letter stream (``<stream>.dead_letter``) with its topic, partition, offset, raw bytes and error.
Record ids are ``kafka:<topic>:<partition>:<offset>``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

from ..errors import HeadraceError, OptionError
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from . import InjectedBatch, Injector, Several, timestamper, wall_clock_ms

__all__ = ["KafkaPart", "kafka", "late_records", "DESERIALIZERS"]

END_LOOK_S = 0.01  # how long the broker's answer that a partition ended is taken as still true
LOOK_EVERY_S = 0.01  # how often a part may look for new partitions before moving its watermark
ASK_TIMEOUT_S = 0.5  # for that answer; without one, the partition holds the watermark
LIST_TIMEOUT_S = 10.0  # for a look's answer; without one, the watermark holds
WAITING_AT_MOST = 64  # watermarks waiting for a look (then the newest is replaced: only freshness is lost)
QUIET_YIELD_S = 1.0  # a part with nothing new yields an empty batch this often, so that a stopped run can end it

DESERIALIZERS: dict[str, Callable[[bytes], Any]] = {
    "bytes": lambda raw: raw,
    "utf-8": lambda raw: raw.decode("utf-8"),
    "json": lambda raw: json.loads(raw),
}


def _deserializer(spec: str | Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    if callable(spec):
        return spec
    if isinstance(spec, str) and spec in DESERIALIZERS:
        return DESERIALIZERS[spec]
    raise OptionError("Unknown Kafka deserializer", got=spec,
                      hint="use deserializer='bytes', 'utf-8', 'json' or a function of the value's bytes")


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise OptionError(f"injectors.kafka()'s {name} must be an integer >= {least}", got=value,
                          hint=f"e.g. {name}={max(least, 1000) if name.endswith('_ms') else max(least, 1)}")
    return value


class _Partition:
    __slots__ = ("offset", "high", "seen_at", "late")

    def __init__(self, offset: int, high: int | None, seen_at: int, late: int = 0):
        self.offset, self.high, self.seen_at, self.late = offset, high, seen_at, late


class KafkaPart(Injector):
    """One part of a Kafka injector: the partitions ``p`` of ``topic`` with ``p % parts == part``."""

    def __init__(self, topic: str, config: dict[str, Any], part: int, parts: int, *, deserializer: Any,
                 timestamp: Any, max_delay_ms: int, idle_ms: int, discover_ms: int, batch_size: int,
                 poll_s: float, bounded: bool, clock: Callable[[], int]):
        self.topic, self.config, self.part, self.part_count = topic, config, part, parts
        self.decode = _deserializer(deserializer)
        self.stamp = None if timestamp is None else timestamper(timestamp, clock)
        self.max_delay_ms, self.idle_ms, self.discover_ms = max_delay_ms, idle_ms, discover_ms
        self.batch_size, self.poll_s, self.bounded, self.clock = batch_size, poll_s, bounded, clock
        self._ends: dict[int, tuple[float, int, int, int]] = {}  # partition: asked at (monotonic, clock), high, low
        self._asker: Any = None  # see _ask

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        # auto.offset.reset: a resumed offset that retention has deleted reads on from the oldest kept
        config = {"group.id": f"headrace-{self.topic}", "auto.offset.reset": "earliest", **self.config,
                  "enable.auto.commit": False, "enable.auto.offset.store": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True}
        return Consumer(config)

    def _ask(self) -> Any:
        """A client for questions to the broker (partitions, where they end), on a connection of its
        own: on the consumer's, a question waits out a fetch's long poll (``fetch.wait.max.ms``,
        500 ms by default), and the part stopped reading that long each time it asked."""
        if self._asker is None:
            self._asker = self._consumer()
        return self._asker

    def _mine(self) -> list[int]:
        topic = self._ask().list_topics(self.topic, timeout=LIST_TIMEOUT_S).topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise OptionError(f"Kafka topic {self.topic!r} was not found", got=getattr(topic, "error", None),
                              hint="create the topic first (headrace does not create input topics)")
        return sorted(p for p in topic.partitions if p % self.part_count == self.part)

    def batches(self, resume: str | None) -> Iterator[InjectedBatch]:
        from confluent_kafka import KafkaError, KafkaException

        saved: dict[str, Any] = json.loads(resume) if resume else {"partitions": {}, "watermark": BEGINNING_OF_TIME}
        now = self.clock()
        state = {int(p): _Partition(o, h, now, late) for p, (o, h, late) in saved["partitions"].items()}
        published = saved["watermark"]
        consumer = self._consumer()
        at_end: set[int] = set()
        assigned: set[int] = set()
        self._ask()  # the looks' client, made here: the looker's thread and this one share it
        looker = _Looker(self._mine, f"headrace-kafka-look-{self.topic}-{self.part}")
        # watermarks (and whether every partition ended) computed from what was read by a moment
        # (monotonic): each may be published once a look for new partitions began after that moment
        waiting: deque[tuple[float, int, bool]] = deque()
        discovered, yielded = self.clock(), time.monotonic()
        try:
            try:  # assigns the resumed partitions
                self._assign(consumer, state, assigned, self._mine())
            except KafkaException:  # unanswered: the looker asks again
                looker.ask()
            while True:
                records: list[tuple[Any, int, str | None]] = []
                dead: list[tuple[Any, int, str | None]] = []
                # a watermark waiting for a look: read no longer than a look takes to come
                wait = LOOK_EVERY_S if waiting else self.poll_s
                for message in self._fetch(consumer, wait) if state else self._idle(wait):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            at_end.add(message.partition())
                            continue
                        raise HeadraceError(f"Kafka consumer of topic {self.topic!r} failed", got=str(error),
                                            hint="check the brokers (bootstrap.servers) and the topic")
                    p = message.partition()
                    at_end.discard(p)
                    self._take(message, state[p], published, records, dead)
                read_at, now = time.monotonic(), self.clock()
                current, now_ended = (self._watermark(consumer, state, published, at_end),
                                      self._ended_all(state, at_end))
                while waiting and waiting[-1][1] > current:  # a partition woke up since: they wait for nothing
                    waiting.pop()
                newest = waiting[-1][1:] if waiting else (published, False)
                if (current, now_ended) != newest and (current > published or now_ended):
                    if len(waiting) == WAITING_AT_MOST:  # the oldest are the first a look covers: keep them
                        waiting.pop()
                    waiting.append((read_at, current, now_ended))
                    looker.ask()
                if now - discovered >= self.discover_ms:
                    discovered = now
                    looker.ask()
                mark, ended = published, False
                answer = looker.answer()
                if answer is not None:
                    began, mine = answer
                    if self._assign(consumer, state, assigned, mine):
                        waiting.clear()  # computed without the new partitions, which hold it back now
                    while waiting and waiting[0][0] < began:  # a partition added before was found by it
                        _, mark, ended = waiting.popleft()
                    # what a look covered, bounded by what holds now (a partition that woke up since):
                    # never back, never past either
                    mark, ended = max(published, min(mark, current)), ended and now_ended
                if ended:
                    mark = END_OF_TIME
                # a quiet part yields too, now and then: the runner publishes nothing of it, but sees a stop
                if records or dead or mark != published or read_at - yielded >= QUIET_YIELD_S:
                    published, yielded = mark, read_at
                    yield InjectedBatch(records, mark, self._checkpoint(state, published), dead)
                if ended:
                    return
        finally:
            stopped = looker.stop()
            consumer.close()
            asker, self._asker = self._asker, None
            if asker is not None and stopped:  # a looker still inside a call keeps its client open
                asker.close()

    def _ended_all(self, state: dict[int, _Partition], at_end: set[int]) -> bool:
        """A bounded part is done once every partition it owns was read to its end."""
        return self.bounded and bool(state) and at_end >= set(state)

    def _fetch(self, consumer: Any, wait_s: float) -> list[Any]:
        """Up to ``batch_size`` of what the consumer holds now; when it holds nothing, what comes
        first within ``wait_s`` and what came with it. (librdkafka's batch call waits out its whole
        timeout unless the batch fills: with it, a record waited up to ``poll_s`` to be injected.)"""
        held = consumer.consume(self.batch_size, 0)
        if held:
            return held
        first = consumer.poll(wait_s)
        if first is None:
            return []
        return [first, *consumer.consume(self.batch_size - 1, 0)] if self.batch_size > 1 else [first]

    @staticmethod
    def _idle(wait_s: float) -> list[Any]:
        """A part that owns no partition yet (more parts than partitions) waits between looks."""
        time.sleep(wait_s)
        return []

    def _assign(self, consumer: Any, state: dict[int, _Partition], assigned: set[int], mine: list[int]) -> bool:
        """Assigns the partitions of ``mine`` not assigned yet, a new one from its first offset;
        whether there were any."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        new = [p for p in mine if p not in assigned]
        now = self.clock()
        for p in new:
            state.setdefault(p, _Partition(OFFSET_BEGINNING, None, now))
        if new:
            consumer.incremental_assign([TopicPartition(self.topic, p, state[p].offset) for p in new])
            assigned.update(new)
        return bool(new)

    def _take(self, message: Any, part: _Partition, published: int, records: list[Any], dead: list[Any]) -> None:
        p, offset = message.partition(), message.offset()
        part.offset, part.seen_at = offset + 1, self.clock()
        rid = f"kafka:{self.topic}:{p}:{offset}"
        kind, kafka_ts = message.timestamp()
        raw = message.value()
        try:
            value = self.decode(raw if raw is not None else b"")
            ts = self.stamp(value) if self.stamp is not None else kafka_ts
        except Exception as exc:
            letter = {"topic": self.topic, "partition": p, "offset": offset, "value": raw,
                      "error": f"{type(exc).__name__}: {exc}"}
            dead.append((letter, max(kafka_ts, 0), rid))
            return
        if ts < published:
            part.late += 1
        part.high = ts if part.high is None or ts > part.high else part.high
        records.append((value, ts, rid))

    def _watermark(self, consumer: Any, state: dict[int, _Partition], published: int, at_end: set[int]) -> int:
        marks = {p: (s.high - self.max_delay_ms if s.high is not None else BEGINNING_OF_TIME) for p, s in state.items()}
        if not marks:
            return published

        def without(idle: set[int]) -> int:  # the part's watermark with these partitions not holding it
            active = [marks[p] for p in state if p not in idle]
            return max(published, min(active) if active else max(marks.values()))

        now = self.clock()
        silent = {p for p in at_end if now - state[p].seen_at >= self.idle_ms}
        if without(silent) <= without(set()):
            return without(set())  # idleness would not move it: no need to ask the broker
        return without({p for p in sorted(silent) if self._ended(consumer, p, state[p])})

    def _ended(self, consumer: Any, p: int, part: _Partition) -> bool:
        """Whether the broker holds nothing of partition ``p`` past what the consumer read: the
        end-of-partition event can be older than records that arrived since, which the consumer
        has not fetched yet (it handed out another partition's backlog first: the first records of
        a partition came 2 s late that way, and were late). Asked at most every ``END_LOOK_S``; an
        answer that the partition is behind holds until the consumer reaches that end."""
        from confluent_kafka import KafkaException, TopicPartition

        where = TopicPartition(self.topic, p)
        # the consumer's position, not the last record's offset + 1: at the end it has stepped over
        # transaction markers and aborted records, which are never handed out
        position = consumer.position([where])[0].offset
        asked = self._ends.get(p)
        now, ticks = time.monotonic(), self.clock()  # fresh by both: a frozen clock, or a test's racing one
        if asked is not None:
            _, _, high, low = asked
            fresh = now - asked[0] < END_LOOK_S and ticks - asked[1] < END_LOOK_S * 1000
            if fresh or high > max(position, part.offset, low):  # "behind" holds until the consumer gets there
                return high <= max(position, part.offset, low)
        try:  # read_committed: the end is the last stable offset; low: retention may have moved past us
            low, high = self._ask().get_watermark_offsets(where, timeout=ASK_TIMEOUT_S, cached=False)
        except KafkaException:
            self._ends[p] = (now, ticks, END_OF_TIME, 0)  # unknown: it holds the watermark until asked again
            return False
        self._ends[p] = (now, ticks, high, low)
        return high <= max(position, part.offset, low)

    def _checkpoint(self, state: dict[int, _Partition], watermark: int) -> str:
        return json.dumps({"partitions": {str(p): [s.offset, s.high, s.late] for p, s in sorted(state.items())},
                           "watermark": watermark})


class _Looker:
    """Asks the broker for a part's partitions on a thread of its own, when asked, at most every
    ``LOOK_EVERY_S``, so that a batch's records never wait for the answer (a look took 2.1 ms p50
    and 16 ms p99 on a busy broker, before a third of the batches)."""

    def __init__(self, mine: Callable[[], list[int]], name: str):
        self._mine = mine
        self._asked, self._stopped = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._answer: tuple[float, list[int]] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def ask(self) -> None:
        self._asked.set()

    def answer(self) -> tuple[float, list[int]] | None:
        """The newest answer not taken yet: when its look began (monotonic), and the partitions."""
        with self._lock:
            if self._error is not None:
                raise self._error
            answer, self._answer = self._answer, None
        return answer

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        began = float("-inf")
        while self._asked.wait() and not self._stopped.wait(max(0.0, began + LOOK_EVERY_S - time.monotonic())):
            self._asked.clear()
            began = time.monotonic()
            try:
                mine = self._mine()
            except KafkaException:  # unanswered: the watermark holds until a look is answered
                self._asked.set()
                continue
            except BaseException as exc:  # the topic is gone: the part raises it
                with self._lock:
                    self._error = exc
                return
            with self._lock:
                self._answer = (began, mine)

    def stop(self) -> bool:
        """Stops the thread; whether it ended (it may be inside a look, for up to ``LIST_TIMEOUT_S``)."""
        self._stopped.set()
        self._asked.set()
        self._thread.join(timeout=LIST_TIMEOUT_S + 1)
        return not self._thread.is_alive()


def late_records(checkpoint: str | None) -> int:
    """How many records a Kafka part injected behind its own published watermark (from its resume state)."""
    return sum(late for _, _, late in json.loads(checkpoint)["partitions"].values()) if checkpoint else 0


def kafka(topic: str, bootstrap_servers: str, *, parts: int = 1, deserializer: str | Callable[[bytes], Any] = "json",
          timestamp: str | Callable[[Any], Any] | None = None, max_delay_ms: int = 0, idle_ms: int = 5_000,
          discover_ms: int = 5_000, batch_size: int = 1_000, poll_s: float = 0.05, bounded: bool = False,
          config: dict[str, Any] | None = None, clock: Callable[[], int] = wall_clock_ms) -> Injector | Several:
    """Inject the records of Kafka ``topic`` (see the module's doc for offsets, watermarks, idle
    partitions and dead letters). ``bounded``: stop, with the end-of-time watermark, once every
    partition has been read to its end. ``poll_s``: how long a part with nothing to read waits for
    a record before it looks at its partitions and watermark again (a record that comes is
    injected at once). ``config``: more librdkafka consumer settings."""
    if not isinstance(topic, str) or not topic:
        raise OptionError("injectors.kafka() needs a topic name", got=topic, hint="e.g. injectors.kafka('searches', ...)")
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers:
        raise OptionError("injectors.kafka() needs bootstrap_servers", got=bootstrap_servers,
                          hint="e.g. bootstrap_servers='127.0.0.1:9092'")
    for name, value, least in (("parts", parts, 1), ("max_delay_ms", max_delay_ms, 0), ("idle_ms", idle_ms, 1),
                               ("discover_ms", discover_ms, 0), ("batch_size", batch_size, 1)):
        _count(name, value, least)
    if isinstance(poll_s, bool) or not isinstance(poll_s, (int, float)) or not 0 < poll_s <= 60:
        raise OptionError("injectors.kafka()'s poll_s must be a number of seconds in (0, 60]", got=poll_s,
                          hint="e.g. poll_s=0.05")
    _deserializer(deserializer)
    merged = {**(config or {}), "bootstrap.servers": bootstrap_servers}
    built = [KafkaPart(topic, merged, i, parts, deserializer=deserializer, timestamp=timestamp,
                       max_delay_ms=max_delay_ms, idle_ms=idle_ms, discover_ms=discover_ms, batch_size=batch_size,
                       poll_s=poll_s, bounded=bounded, clock=clock) for i in range(parts)]
    return built[0] if parts == 1 else Several(built)
