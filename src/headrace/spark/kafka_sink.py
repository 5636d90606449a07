"""The Kafka sink: a stream's committed records, written to a Kafka topic exactly once for
``read_committed`` consumers (docs/architecture.md §3.18).

A writer thread on the driver (not a Spark query: a hop costs a store read and a Kafka
transaction, not a micro-batch) tails the journal of the stream's producers. Each cycle is one
Kafka transaction of a transactional producer whose ``transactional.id`` belongs to the sink
(``names.kafka_sink_id``): the records of the producers' batches it has not written yet, and its
*ledger*, ``{producer: last batch written}``, committed as the offset metadata of a consumer group
of the same name through ``send_offsets_to_transaction``. Records and ledger commit or abort
together, so a writer that crashes anywhere, even after Kafka committed and before anything else
was recorded, resumes from exactly what Kafka holds: no batch is written twice or skipped.

Two such producers (*lanes*) take turns, one transaction each: Kafka's coordinator refuses a
transactional id's next transaction until the markers of its last are written, and the other
lane's last transaction is a cycle older. Transactions still commit one after the other, so the
output is in batch order and the committed ledgers form a sequence: the one with the highest offset
(the count of transactions) is the sink's position.

Fencing: a writer holds a lease in the store (``meta.sink_lease``) and takes it only once the
previous holder's has run out; then ``init_transactions`` bumps the producer epoch of each lane's id, which
aborts the old writer's open transaction and makes Kafka refuse anything it sends after. So a zombie
(a writer paused past its lease, then resumed) cannot commit, whatever it believes.

Each message carries the record id (the key, by default, and the ``headrace.id`` header) so a
downstream consumer can also dedup, and the record's timestamp in the ``headrace.timestamp`` header.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
import zlib
from contextlib import ExitStack
from typing import Any

from ..errors import FencedWriterError, HeadraceError, OptionError, UserCodeError
from ..kafka_target import KafkaTarget
from ..names import kafka_sink_id, meta
from ..store import open_store
from ..store.failpoints import failpoint_from_env
from ..sinkspec import SinkSpec

__all__ = ["KafkaSinkWriter", "KafkaSink", "SINK_COMMIT"]

SINK_COMMIT = "sink_commit"  # the failpoint step just before a Kafka sink commits its transaction
MAX_BATCHES = 50  # per producer and transaction, so a writer far behind commits in steps
TIMEOUT_S = 30.0
LANES = 2  # transactional producers taking turns
METADATA_LIMIT = 4096  # the broker's offset.metadata.max.bytes, by default


def encode_ledger(positions: dict[str, int]) -> str:
    return base64.b64encode(zlib.compress(json.dumps(positions, sort_keys=True).encode())).decode()


def decode_ledger(text: str | None) -> dict[str, int]:
    return {str(p): int(b) for p, b in json.loads(zlib.decompress(base64.b64decode(text))).items()} if text else {}


class KafkaSinkWriter:
    """One writer of one Kafka sink: ``open`` (lease, fence, read the ledger), then ``write_once``."""

    def __init__(self, topology: str, spec: SinkSpec, store_url: str, owner: str | None = None):
        assert spec.kafka is not None  # parse_sink builds a Kafka sink's spec with its target
        self.spec, self.target = spec, spec.kafka
        self.lanes = [_Lane(kafka_sink_id(topology, spec.name, i)) for i in range(LANES)]
        self.lease_key = meta.sink_lease(topology, spec.name)
        self.owner = owner or uuid.uuid4().hex[:12]
        self.store = open_store(store_url)
        self.positions: dict[str, int] = {}
        self.sequence = 0  # transactions committed under the ledger so far (its offset)
        self.lease_until = 0
        self.failpoint = failpoint_from_env()
        self.producers: list[str] = []  # the stream's, refreshed every second
        self._producers_at = 0.0

    # -- the lease ----------------------------------------------------------------------------------

    def _holder(self) -> dict[str, Any] | None:
        raw = self.store.get_meta(self.lease_key)
        return json.loads(raw) if raw else None

    def _take_lease(self, stop: threading.Event | None) -> None:
        """Wait until no other writer's lease is live, then take it."""
        while True:
            now, held = self.store.now(), self._holder()
            if held is None or held["owner"] == self.owner or held["until"] <= now:
                self._put_lease(now)
                return
            wait_s = min(held["until"] - now, 200) / 1000
            if stop is not None and stop.wait(wait_s):
                raise FencedWriterError(f"The Kafka sink {self.spec.name!r} stopped before it got its lease",
                                        got=held["owner"], hint="nothing was written; start it again")
            if stop is None:
                time.sleep(wait_s)

    def _put_lease(self, now: int) -> None:
        self.lease_until = now + self.target.lease_ms
        self.store.put_meta(self.lease_key, json.dumps({"owner": self.owner, "until": self.lease_until}))

    def _keep_lease(self) -> None:
        """Renew the lease when a third of it is gone; a writer whose lease another took is fenced."""
        now = self.store.now()
        if now < self.lease_until - 2 * self.target.lease_ms // 3:
            return
        held = self._holder()
        if held is not None and held["owner"] != self.owner:
            raise FencedWriterError(f"The Kafka sink {self.spec.name!r} lost its lease to another writer",
                                    got=held["owner"], hint="a newer driver writes the sink now; this one stops")
        self._put_lease(now)

    # -- Kafka ----------------------------------------------------------------------------------------

    def open(self, stop: threading.Event | None = None) -> "KafkaSinkWriter":
        from confluent_kafka import KafkaException

        self._take_lease(stop)
        for lane in self.lanes:
            lane.connect(self.target)
        self._check_topic(self.lanes[0].producer)  # before anything is fenced
        for lane in self.lanes:
            try:
                lane.fence(self.target)
            except KafkaException as exc:
                raise HeadraceError(f"Kafka sink {self.spec.name!r} could not start its transactional producer "
                                    f"{lane.txn_id!r}", got=exc.args[0].str(),
                                    hint="check the brokers, and that the sink may use this transactional.id and "
                                         "consumer group (ACLs); nothing was written") from exc
        self.positions, self.sequence = self.ledger()
        return self

    def _check_topic(self, producer: Any) -> None:
        found = producer.list_topics(self.target.topic, timeout=TIMEOUT_S).topics.get(self.target.topic)
        if found is None or found.error is not None:
            raise OptionError(f"Kafka topic {self.target.topic!r} of sink {self.spec.name!r} was not found",
                              got=getattr(found, "error", None), hint="create the topic first (headrace does not "
                                                                      "create output topics)")

    def ledger(self) -> tuple[dict[str, int], int]:
        """The last committed ledger: per producer the last batch written, and the transactions so far."""
        return max((lane.ledger(self.target.topic) for lane in self.lanes), key=lambda found: found[1])

    def _todo(self, refresh: bool) -> dict[str, tuple[int, int]]:
        if refresh or time.monotonic() - self._producers_at > 1.0:
            self.producers, self._producers_at = self.store.stream_producers(self.spec.stream), time.monotonic()
        heads = self.store.latest_batches(self.producers)
        return {p: (self.positions.get(p, 0), min(head, self.positions.get(p, 0) + MAX_BATCHES))
                for p, head in heads.items() if head > self.positions.get(p, 0)}

    def write_once(self, refresh: bool = False) -> int:
        """One transaction of what is journaled and not yet written; the records written (0: none)."""
        from confluent_kafka import KafkaException, TopicPartition

        todo = self._todo(refresh)
        self._keep_lease()
        if not todo:
            return 0
        positions = {**self.positions, **{p: upto for p, (_, upto) in todo.items()}}
        ledger = encode_ledger(positions)
        if len(ledger) > METADATA_LIMIT:
            raise HeadraceError(f"The ledger of Kafka sink {self.spec.name!r} outgrew the broker's offset metadata",
                                got=f"{len(ledger)} bytes for {len(positions)} producers",
                                hint="raise offset.metadata.max.bytes on the brokers, or give the stream's producer "
                                     "fewer intervals")
        lane = self.lanes[self.sequence % LANES]
        lane.producer.begin_transaction()
        try:
            n = sum(self._produce(lane.producer, p, after, upto) for p, (after, upto) in sorted(todo.items()))
            lane.producer.send_offsets_to_transaction(
                [TopicPartition(self.target.topic, 0, self.sequence + 1, metadata=ledger)],
                lane.group.consumer_group_metadata(), TIMEOUT_S)
            if self.failpoint is not None:
                self.failpoint(SINK_COMMIT)
            lane.producer.commit_transaction(TIMEOUT_S)
        except KafkaException as exc:
            raise self._failed(lane, exc.args[0]) from exc
        except BaseException:
            lane.producer.abort_transaction(TIMEOUT_S)
            raise
        self.positions, self.sequence = positions, self.sequence + 1
        return n

    def _produce(self, out: Any, producer: str, after: int, upto: int) -> int:
        """Sends the records of ``producer``'s batches ``after`` < b <= ``upto`` through ``out``, a lane's producer."""
        target: KafkaTarget = self.target
        n = 0
        for _, r in self.store.read_segments(self.spec.stream, producer, after, upto):
            try:
                value = target.serialize(r.value)
            except Exception as exc:
                raise UserCodeError(f"Kafka sink {self.spec.name!r} could not serialize record {r.id!r}",
                                    got_text=f"{type(exc).__name__}: {exc}; value {r.value!r:.200}",
                                    hint="pass serializer= a function of the value that returns bytes; nothing of "
                                         "this transaction was committed, and the records stay in the store") from exc
            key = r.id if target.key == "id" else r.key
            headers = [("headrace.id", r.id.encode()), ("headrace.timestamp", str(r.timestamp).encode())]
            while True:
                try:
                    out.produce(target.topic, value, key=None if key is None else key.encode(), headers=headers)
                    break
                except BufferError:  # the local queue is full: let it drain
                    out.poll(0.05)
            n += 1
        return n

    def _failed(self, lane: "_Lane", error: Any) -> HeadraceError:
        from confluent_kafka import KafkaError

        if error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                             KafkaError.INVALID_PRODUCER_EPOCH):
            return FencedWriterError(f"Kafka fenced the writer of sink {self.spec.name!r}: a newer writer took its "
                                     f"transactional.id {lane.txn_id!r}", got=error.str(),
                                     hint="nothing of this writer's open transaction was committed; the newer writer "
                                          "goes on from the ledger")
        if error.txn_requires_abort():
            lane.producer.abort_transaction(TIMEOUT_S)
        return HeadraceError(f"Kafka sink {self.spec.name!r} could not commit a transaction", got=error.str(),
                             hint="check the brokers and the topic; the sink resumes from its last committed batch")

    def close(self) -> None:
        try:
            held = self._holder()
            if held is not None and held["owner"] == self.owner:
                self.store.delete_meta(self.lease_key)  # the next writer need not wait for it to run out
        finally:
            with ExitStack() as closing:  # each, whatever another raises
                closing.callback(self.store.close)
                for lane in self.lanes:
                    closing.callback(lane.close)


class _Lane:
    """One of a sink's transactional producers, and the consumer group its ledger commits under."""

    def __init__(self, txn_id: str):
        self.txn_id = txn_id
        self.producer: Any = None
        self.group: Any = None

    def connect(self, target: KafkaTarget) -> None:
        from confluent_kafka import Producer

        # retry.backoff.ms: the coordinator answers CONCURRENT_TRANSACTIONS to a transaction's offsets
        # until the previous one's markers are written (a few ms); at librdkafka's default backoff each
        # transaction waited 100 ms for that retry (send_offsets_to_transaction p50 99 ms, at 2 ms 3.9 ms)
        config = {"linger.ms": 1, "retry.backoff.ms": 2, **target.config, "bootstrap.servers": target.bootstrap_servers,
                  "transactional.id": self.txn_id, "partitioner": "murmur2_random"}
        self.producer = Producer(config)

    def fence(self, target: KafkaTarget) -> None:
        from confluent_kafka import Consumer

        # bumps the id's epoch: the previous writer's open transaction is aborted and it is fenced
        self.producer.init_transactions(TIMEOUT_S)
        self.group = Consumer({"bootstrap.servers": target.bootstrap_servers, "group.id": self.txn_id,
                               "isolation.level": "read_committed", "enable.auto.commit": False})

    def ledger(self, topic: str) -> tuple[dict[str, int], int]:
        """This lane's last committed ledger and its offset (0 if it committed none)."""
        from confluent_kafka import TopicPartition

        committed = self.group.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)[0]
        if committed.offset < 0:
            return {}, 0
        return decode_ledger(committed.metadata), committed.offset

    def close(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()


class KafkaSink:
    """A Kafka sink on the driver: a writer thread, with ``SinkQuery``'s interface for the runners."""

    def __init__(self, topology: str, spec: SinkSpec, url: str, idle_s: float = 0.05):
        self.spec, self.idle_s = spec, idle_s
        self.writer = KafkaSinkWriter(topology, spec, url)
        # its own connection, to sleep on outside the lock: flush() waits for the lock, not a sleep
        self.waiter = open_store(url)
        self.lock = threading.Lock()
        self.opened, self.stopping = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=f"headrace-sink-{spec.name}", daemon=True)

    def start(self) -> "KafkaSink":
        self.thread.start()
        return self

    def _loop(self) -> None:
        try:
            self.writer.open(self.stopping)
            self.opened.set()
            while not self.stopping.is_set():
                with self.lock:  # flush() writes from the runner's thread, on the same connections
                    wrote = self.writer.write_once()
                if not wrote:  # woken by a producer's commit, or looks again
                    self.waiter.wait_for_commits(self.writer.producers, self.idle_s)
        except BaseException as exc:
            if not self.stopping.is_set():
                self.error = exc
        finally:
            self.opened.set()

    def flush(self) -> None:
        """Write everything journaled so far (the runner calls it once the topology has drained)."""
        self.opened.wait()
        self.check()
        with self.lock:
            while self.writer.write_once(refresh=True):
                pass

    def written(self) -> dict[str, int] | None:
        return dict(self.writer.positions) if self.opened.is_set() and self.error is None else None

    def check(self) -> None:
        if self.error is None:
            return
        if isinstance(self.error, HeadraceError):
            raise self.error
        raise UserCodeError(f"The Kafka sink {self.spec.name!r} of stream {self.spec.stream!r} failed",
                            got_text=f"{type(self.error).__name__}: {self.error}",
                            hint="fix the cause and run again: the sink resumes from its last committed batch")

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=TIMEOUT_S)
        try:
            self.writer.close()
        finally:
            self.waiter.close()
