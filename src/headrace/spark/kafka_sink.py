"""The Kafka sink: a stream's committed records, written to a Kafka topic exactly once for
``read_committed`` consumers (docs/architecture.md §3.18).

A writer thread on the driver (not a Spark query: a hop costs a store read and a Kafka
transaction, not a micro-batch) tails the journal of the stream's producers. Each cycle is one
Kafka transaction of a transactional producer whose ``transactional.id`` belongs to the sink
(``names.kafka_sink_id``): the records of the producers' batches it has not written yet, and its
*ledger*, ``{producer: last batch written}``, committed as the offset metadata of a consumer group
of the same name through ``send_offsets_to_transaction``. Records and ledger commit or abort
together, so a writer that crashes anywhere, even after Kafka committed and before anything else
was recorded, resumes from exactly what Kafka holds: no batch is written twice or skipped. The
ledger names the store whose batches it counts; a sink refuses, before fencing anything, a ledger
of another store (a same-named topology on another store, or a store re-created).

Two such producers (*lanes*) take turns, one transaction each: Kafka's coordinator refuses a
transactional id's next transaction until the markers of its last are written, and the other
lane's last transaction is a cycle older. Transactions still commit one after the other, so the
output is in batch order and the committed ledgers form a sequence: the one with the highest offset
(the count of transactions) is the sink's position.

Fencing: a writer holds a lease in the store (``meta.sink_lease``) and takes it only once the
previous holder's has run out; then ``init_transactions`` bumps the producer epoch of each lane's id, which
aborts the old writer's open transaction and makes Kafka refuse anything it sends after. So a zombie
(a writer paused past its lease, then resumed) cannot commit, whatever it believes.

A broker that goes away (restarts, stalls) does not end the run: a transaction that fails with an
error of a broker away or busy (``transient``), or whose offsets or commit does not return within
``TIMEOUT_S`` (librdkafka can wait on a restarted coordinator forever, its own timeout unchecked:
confluentinc/librdkafka#5456 and #5511), is given up, and the writer starts its lanes again (new
producers: ``init_transactions`` aborts what the old ones left open) and resumes from the ledger,
retrying with a growing pause until Kafka answers. A producer stuck inside such a call is left to
its thread, never used again (one per outage, until the call returns). A fence stops the run
unless the writer still holds its lease: then it is the broker aborting a transaction older than
``transaction.timeout.ms`` (librdkafka reports that as a fence too), and the writer starts its lanes
again as after an outage, up to three times in ten minutes. A refusal (authorization, a message too
large) and a value the serializer refuses stop the run. A sink's start waits for a broker that
answers but is not ready (its coordinators loading) for up to ``FLUSH_RETRY_S``.

Each message carries the record id (the key, by default, and the ``headrace.id`` header) so a
downstream consumer can also dedup, and the record's timestamp in the ``headrace.timestamp`` header.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

from ..errors import FencedWriterError, HeadraceError, OptionError, UserCodeError
from ..kafka_target import KafkaTarget
from ..names import kafka_sink_id, meta
from ..store import open_store
from ..store.failpoints import failpoint_from_env
from ..sinkspec import SinkSpec
from .budget import FailureBudget
from .kafka_lanes import (METADATA_LIMIT, TIMEOUT_S, KafkaCommitError, Lane, Ledger, abort, encode_ledger, loading,
                          transient)

__all__ = ["KafkaSinkWriter", "KafkaSink", "KafkaCommitError", "SINK_COMMIT"]

SINK_COMMIT = "sink_commit"  # the failpoint step just before a Kafka sink commits its transaction
MAX_BATCHES = 50  # per producer and transaction, so a writer far behind commits in steps
LANES = 2  # transactional producers taking turns
RETRY_S = (0.5, 10.0)  # pauses before a writer starts its lanes again after a failed transaction: first, most
FLUSH_RETRY_S = 300.0  # how long a drained run's last write keeps trying through a broker that is away


class KafkaSinkWriter:
    """One writer of one Kafka sink: ``open`` (lease, fence, read the ledger), then ``write_once``."""

    def __init__(self, topology: str, spec: SinkSpec, store_url: str, owner: str | None = None):
        assert spec.kafka is not None  # parse_sink builds a Kafka sink's spec with its target
        self.spec, self.target = spec, spec.kafka
        self.lanes = [Lane(kafka_sink_id(topology, spec.name, i)) for i in range(LANES)]
        self.lease_key = meta.sink_lease(topology, spec.name)
        self.owner = owner or uuid.uuid4().hex[:12]
        self.store = open_store(store_url)
        self.store_id = self.store.instance_id()  # named in the ledger: whose batches its positions count
        self.positions: dict[str, int] = {}
        self.sequence = 0  # transactions committed under the ledger so far (its offset)
        self.lease_until = 0
        self.failpoint = failpoint_from_env()
        self.broken = False  # a transaction failed: the lanes start again before the next one (``reopen``)
        self.fences = FailureBudget(limit=4, window_s=600.0)  # three fences with the lease its own; a fourth stands
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
        if (lost := self._lease_lost()) is not None:
            raise lost
        self._put_lease(now)

    def _lease_lost(self) -> FencedWriterError | None:
        """The error of a writer whose lease is not its own any more (one gone: a newer writer took
        it, then closed); None while it is."""
        held = self._holder()
        if held is not None and held["owner"] == self.owner:
            return None
        return FencedWriterError(f"The Kafka sink {self.spec.name!r} lost its lease to another writer",
                                 got=held and held["owner"], hint="a newer driver writes the sink now; this one stops")

    # -- Kafka ----------------------------------------------------------------------------------------

    def open(self, stop: threading.Event | None = None) -> "KafkaSinkWriter":
        """Take the lease (waiting while another writer's is live), fence both lanes, read the ledger."""
        self._take_lease(stop)
        return self._start_lanes()

    def _start_lanes(self) -> "KafkaSinkWriter":
        from confluent_kafka import KafkaException

        for lane in self.lanes:
            lane.connect(self.target)
        try:
            self._check_topic(self.lanes[0].producer)  # before anything is fenced
            for lane in self.lanes:
                with self._refused(lane, "read the ledger of"):
                    self._check_ledger(lane.peek(self.target), fenced=False)
            for lane in self.lanes:
                with self._refused(lane, "start its transactional producer"):
                    lane.fence(self.target)
            found = self.ledger()
            self._check_ledger(found, fenced=True)
            self.positions, self.sequence = found.positions, found.offset
        except KafkaException as exc:  # the topic's metadata or a ledger not read in time
            if not transient(exc.args[0]):
                raise
            raise KafkaCommitError(f"Kafka sink {self.spec.name!r} could not reach its brokers", got=exc.args[0].str(),
                                   hint="check the brokers; nothing was written") from exc
        self.broken = False
        return self

    def _check_topic(self, producer: Any) -> None:
        from confluent_kafka import KafkaException

        found = producer.list_topics(self.target.topic, timeout=TIMEOUT_S).topics.get(self.target.topic)
        if found is not None and found.error is not None and transient(found.error):
            raise KafkaCommitError(f"Kafka topic {self.target.topic!r} of sink {self.spec.name!r} is not served yet",
                                   got=found.error.str(), hint="check the brokers; nothing was written") \
                from KafkaException(found.error)
        if found is None or found.error is not None:
            raise OptionError(f"Kafka topic {self.target.topic!r} of sink {self.spec.name!r} was not found",
                              got=getattr(found, "error", None), hint="create the topic first (headrace does not "
                                                                      "create output topics)")

    @contextmanager
    def _refused(self, lane: Lane, doing: str) -> Iterator[None]:
        from confluent_kafka import KafkaException

        try:
            yield
        except KafkaException as exc:
            error = KafkaCommitError if transient(exc.args[0]) else HeadraceError
            raise error(f"Kafka sink {self.spec.name!r} could not {doing} {lane.txn_id!r}", got=exc.args[0].str(),
                        hint="check the brokers, and that the sink may use this transactional.id and consumer group "
                             "(ACLs); nothing was written") from exc

    def _check_ledger(self, found: Ledger, fenced: bool) -> None:
        """Refuse another store's ledger (a same-named topology's, or a re-created store's), whose
        positions this store would take for its own, skipping as many batches; one from before
        ledgers named their store must count no batch this store never journaled."""
        heads = self.store.latest_batches(sorted(found.positions))
        beyond = sorted((p, b) for p, b in found.positions.items() if b > heads.get(p, 0))
        theirs = found.store not in (None, self.store_id)
        if not theirs and not beyond:
            return
        ids = ", ".join(repr(lane.txn_id) for lane in self.lanes)
        got = (f"a ledger of store {found.store}; this store is {self.store_id}" if theirs
               else f"a ledger at batch {beyond[0][1]} of {beyond[0][0]!r}, which this store journaled to batch "
                    f"{heads.get(beyond[0][0], 0)}")
        raise HeadraceError(f"The ledger of Kafka sink {self.spec.name!r} in Kafka is another store's", got_text=got,
                            hint=f"give this topology another name (the sink's transactional ids {ids} are made of "
                                 "the topology's and the sink's names); or, if this store replaced the one that wrote "
                                 f"the topic, delete the consumer groups {ids} (kafka-consumer-groups --delete "
                                 "--group ID) to start the ledger over; nothing was "
                                 + ("written" if fenced else "fenced or written"))

    def ledger(self) -> Ledger:
        """The last committed ledger (the lanes' with the most transactions)."""
        return max((lane.ledger(self.target.topic) for lane in self.lanes), key=lambda found: found.offset)

    def _todo(self, refresh: bool) -> dict[str, tuple[int, int]]:
        if refresh or time.monotonic() - self._producers_at > 1.0:
            self.producers, self._producers_at = self.store.stream_producers(self.spec.stream), time.monotonic()
        heads = self.store.latest_batches(self.producers)
        return {p: (self.positions.get(p, 0), min(head, self.positions.get(p, 0) + MAX_BATCHES))
                for p, head in heads.items() if head > self.positions.get(p, 0)}

    def write_once(self, refresh: bool = False) -> int:
        """One transaction of what is journaled and not yet written; the records written (0: none)."""
        from confluent_kafka import KafkaException, TopicPartition

        if self.broken:
            self.reopen()
        todo = self._todo(refresh)
        self._keep_lease()
        if not todo:
            return 0
        positions = {**self.positions, **{p: upto for p, (_, upto) in todo.items()}}
        ledger = encode_ledger(positions, self.store_id)
        if len(ledger) > METADATA_LIMIT:
            raise HeadraceError(f"The ledger of Kafka sink {self.spec.name!r} outgrew the broker's offset metadata",
                                got=f"{len(ledger)} bytes for {len(positions)} producers",
                                hint="raise offset.metadata.max.bytes on the brokers, or give the stream's producer "
                                     "fewer intervals")
        lane = self.lanes[self.sequence % LANES]
        try:
            lane.producer.begin_transaction()
        except KafkaException as exc:
            raise self._failed(lane, exc.args[0]) from exc
        try:
            n = sum(self._produce(lane.producer, p, after, upto) for p, (after, upto) in sorted(todo.items()))
            lane.within(lane.producer.send_offsets_to_transaction,
                        [TopicPartition(self.target.topic, 0, self.sequence + 1, metadata=ledger)],
                        lane.group.consumer_group_metadata(), TIMEOUT_S)
            if self.failpoint is not None:
                self.failpoint(SINK_COMMIT)
            lane.within(lane.producer.commit_transaction, TIMEOUT_S)
        except KafkaException as exc:
            raise self._failed(lane, exc.args[0]) from exc
        except KafkaCommitError:
            self.broken = True
            raise
        except BaseException:
            abort(lane)
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

    def _failed(self, lane: "Lane", error: Any) -> HeadraceError:
        from confluent_kafka import KafkaError

        # _FATAL: what produce() says once the producer was fenced
        if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                            KafkaError._FATAL):
            return self._fenced(lane, error)
        if not transient(error):  # a refusal (authorization, a message too large) comes back every time
            if error.txn_requires_abort():
                abort(lane)
            return HeadraceError(f"Kafka sink {self.spec.name!r} could not commit a transaction", got=error.str(),
                                 hint="check the brokers, the topic and the sink's rights on it; nothing of this "
                                      "transaction was committed, and the sink resumes from its last committed batch")
        self.broken = True
        return KafkaCommitError(f"Kafka sink {self.spec.name!r} could not commit a transaction", got=error.str(),
                                hint="check the brokers; the sink starts its producers again and resumes from its "
                                     "last committed batch")

    def _fenced(self, lane: "Lane", error: Any) -> HeadraceError:
        """A fence stops the writer unless it still holds its lease: librdkafka reports a
        transaction the broker aborted for outliving ``transaction.timeout.ms`` as a fence too (the
        coordinator bumps the epoch), and then the writer starts again, a few times in a while."""
        if self._lease_lost() is not None:
            return FencedWriterError(f"Kafka fenced the writer of sink {self.spec.name!r}: a newer writer took its "
                                     f"transactional.id {lane.txn_id!r}", got=error.str(),
                                     hint="nothing of this writer's open transaction was committed; the newer writer "
                                          "goes on from the ledger")
        if not self.fences.spend(time.monotonic()):
            return HeadraceError(f"Kafka fenced the writer of sink {self.spec.name!r} {self.fences.limit} times in "
                                 f"{self.fences.window_s / 60:.0f} minutes with its lease its own", got=error.str(),
                                 hint="its transactions outlive the producers' transaction.timeout.ms, or a driver on "
                                      "another store runs a topology of the same name into this Kafka cluster (the "
                                      "transactional.id is made of the topology's and the sink's names): give it "
                                      "another name")
        self.broken = True
        return KafkaCommitError(f"Kafka fenced the transactional producer {lane.txn_id!r} of sink "
                                f"{self.spec.name!r}, and the sink's lease is still its own", got=error.str(),
                                hint="the broker aborted a transaction older than its transaction.timeout.ms (a "
                                     "driver paused that long); nothing of it was committed, and the sink starts its "
                                     "producers again and resumes from its last committed batch")

    def reopen(self) -> "KafkaSinkWriter":
        """New lanes in place of the old (a lane stuck inside a call is left to its thread), then
        ``open``: the new producers' ``init_transactions`` abort what the old left open, and the
        ledger says where to resume. A writer whose lease another took meanwhile is fenced."""
        if (lost := self._lease_lost()) is not None:
            raise lost
        self._put_lease(self.store.now())
        old, self.lanes = self.lanes, [Lane(lane.txn_id) for lane in self.lanes]
        with ExitStack() as closing:
            for lane in old:
                closing.callback(lane.close)
        return self._start_lanes()

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
        pause = RETRY_S[0]
        try:
            deadline: float | None = None  # from the first refusal: the wait for the lease is not the broker's
            while True:
                try:
                    if self.writer.broken:
                        self.writer.reopen()
                    else:
                        self.writer.open(self.stopping)
                    break
                except KafkaCommitError as exc:  # a broker that answers but is not ready yet is waited for
                    deadline = deadline or time.monotonic() + FLUSH_RETRY_S
                    if not loading(exc.__cause__) or time.monotonic() > deadline:
                        raise
                    self.writer.broken = True
                    if not self._waited(exc, pause):
                        return
                    pause = min(2 * pause, RETRY_S[1])
            self.opened.set()
            while not self.stopping.is_set():
                try:
                    with self.lock:  # flush() writes from the runner's thread, on the same connections
                        wrote = self.writer.write_once()
                    pause = RETRY_S[0]
                except KafkaCommitError as exc:  # the next write_once starts the lanes again first
                    if not self._waited(exc, pause):
                        return
                    pause = min(2 * pause, RETRY_S[1])
                    continue
                if not wrote:  # woken by a producer's commit, or looks again
                    self.waiter.wait_for_commits(self.writer.producers, self.idle_s)
        except BaseException as exc:
            if not self.stopping.is_set():
                self.error = exc
        finally:
            self.opened.set()

    def flush(self) -> None:
        """Write everything journaled so far (the runner calls it once the topology has drained),
        through a broker away for up to ``FLUSH_RETRY_S``."""
        self.opened.wait()
        self.check()
        pause, deadline = RETRY_S[0], time.monotonic() + FLUSH_RETRY_S
        while True:
            try:
                with self.lock:
                    while self.writer.write_once(refresh=True):
                        pass
                return
            except KafkaCommitError as exc:
                if time.monotonic() > deadline or not self._waited(exc, pause):
                    raise
                pause = min(2 * pause, RETRY_S[1])

    def _waited(self, exc: KafkaCommitError, pause: float) -> bool:
        """Say why a transaction was given up, then wait ``pause`` s; False if the sink stopped meanwhile."""
        print(f"headrace: {exc}; the Kafka sink starts its producers again in {pause:.1f} s", file=sys.stderr,
              flush=True)
        return not self.stopping.wait(pause)

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
        """Stop the writer thread; its connections are closed once it has ended (a thread inside a
        start of its lanes may take several of Kafka's timeouts: one left running keeps them)."""
        self.stopping.set()
        self.thread.join(timeout=4 * TIMEOUT_S)
        try:
            if not self.thread.is_alive():
                self.writer.close()
        finally:
            self.waiter.close()
