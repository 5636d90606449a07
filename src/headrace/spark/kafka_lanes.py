"""A Kafka sink's transactional producers (*lanes*, spark/kafka_sink.py): each with the consumer
group its ledger commits under, its transactional calls on a daemon thread of its own so that one
that never returns can be given up (``within``), and which of Kafka's errors say the broker is
away or busy (``transient``), after which the sink starts its lanes again rather than end the run."""

from __future__ import annotations

import base64
import json
import queue
import threading
import weakref
import zlib
from concurrent.futures import Future
from concurrent.futures import TimeoutError as CallTimedOut
from typing import Any, Callable, NamedTuple

from ..errors import HeadraceError
from ..kafka_target import KafkaTarget

__all__ = ["KafkaCommitError", "Lane", "TIMEOUT_S", "METADATA_LIMIT", "abort", "transient", "loading",
           "encode_ledger", "decode_ledger", "ledger_store", "Ledger"]

TIMEOUT_S = 30.0  # a transactional call's, and a look's
# errors of a broker away or busy (else a fence, which the sink weighs against its lease, or a refusal:
# authorization, a message too large, which stops the run)
_TRANSIENT = frozenset({"_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_MSG_TIMED_OUT", "_TIMED_OUT_QUEUE",
                        "_WAIT_COORD", "_RESOLVE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "NOT_COORDINATOR",
                        "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "BROKER_NOT_AVAILABLE",
                        "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION", "CONCURRENT_TRANSACTIONS",
                        "TRANSACTION_ABORTABLE"})


class KafkaCommitError(HeadraceError):
    """A transaction the sink could not commit, or its producers could not start, Kafka
    unreachable or not answering: the writer starts its lanes again and resumes from its ledger
    (``KafkaSink``); of the transaction, all committed or nothing."""


def transient(error: Any) -> bool:
    """Whether a ``KafkaError`` says the broker is away or busy (worth starting again)."""
    from confluent_kafka import KafkaError

    codes = {getattr(KafkaError, name) for name in _TRANSIENT if hasattr(KafkaError, name)}
    return not error.fatal() and (error.retriable() or error.code() in codes)


def loading(cause: BaseException | None) -> bool:
    """Whether a failed start of the lanes met a broker that answers but is not ready yet (a
    broker just started answered the ledger's read NOT_COORDINATOR in one start of three here),
    rather than one away or misnamed."""
    from confluent_kafka import KafkaError, KafkaException

    return isinstance(cause, KafkaException) and isinstance(cause.args[0], KafkaError) and cause.args[0].code() in (
        KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.CONCURRENT_TRANSACTIONS, KafkaError.LEADER_NOT_AVAILABLE)


METADATA_LIMIT = 4096  # the broker's offset.metadata.max.bytes, by default


class Ledger(NamedTuple):
    """A lane's last committed ledger: per producer the last batch written, the transactions so
    far (its offset), and the store whose batches those are (None: none, or from before ledgers
    named it)."""

    positions: dict[str, int]
    offset: int
    store: str | None


def encode_ledger(positions: dict[str, int], store: str) -> str:
    """The ledger: per producer the last batch written, and the store (its ``instance_id``) whose
    batches those are."""
    return base64.b64encode(zlib.compress(json.dumps({"positions": positions, "store": store},
                                                     sort_keys=True).encode())).decode()


def _ledger(text: str | None) -> tuple[dict[str, int], str | None]:
    found = json.loads(zlib.decompress(base64.b64decode(text))) if text else {}
    if not isinstance(found.get("positions"), dict):  # none, or written before ledgers named their store
        return {str(p): int(b) for p, b in found.items()}, None
    return {str(p): int(b) for p, b in found["positions"].items()}, str(found["store"])


def decode_ledger(text: str | None) -> dict[str, int]:
    return _ledger(text)[0]


def ledger_store(text: str | None) -> str | None:
    """The store a ledger's positions are of (None: no ledger, or one from before it was named)."""
    return _ledger(text)[1]


class Lane:
    """One of a sink's transactional producers, and the consumer group its ledger commits under."""

    def __init__(self, txn_id: str):
        self.txn_id = txn_id
        self.producer: Any = None
        self.group: Any = None
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] | None = None

    def within(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` (a transactional call given ``TIMEOUT_S``) on the lane's own daemon thread
        (one that never returns must not hold the process at its exit), given up once it overran
        that by a second: the lane is then its thread's, never used again."""
        name = getattr(call, "__name__", repr(call))
        future: Future[Any] = Future()
        self._thread().put((future, call, args))
        del call, args  # a traceback through this frame must not keep the producer (see close)
        try:
            return future.result(TIMEOUT_S + 1)
        except CallTimedOut:
            raise KafkaCommitError(f"Kafka did not answer the transactional producer {self.txn_id!r} within "
                                   f"{TIMEOUT_S + 1:.0f} s", got=name,
                                   hint="the sink gives the producer up, starts a new one and resumes from its last "
                                        "committed batch") from None
        finally:
            del future  # its exception's traceback holds this frame: no cycle through it

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

        # bumps the id's epoch: the previous writer's open transaction is aborted and it is fenced. On its
        # lane's thread: after a broker restart it went on answering CONCURRENT_TRANSACTIONS past its timeout
        self.within(self.producer.init_transactions, TIMEOUT_S)
        self.group = Consumer(_group_config(target, self.txn_id, "read_committed"))

    def peek(self, target: KafkaTarget) -> Ledger:
        """This lane's last committed ledger, read before the lane fences anything, and without
        waiting for a transaction left open (``read_uncommitted``)."""
        from confluent_kafka import Consumer

        probe = Consumer(_group_config(target, self.txn_id, "read_uncommitted"))
        try:
            return self._read(probe, target.topic)
        finally:  # after the read, on the lane's thread, not waited for (a closed consumer is freed anywhere)
            self._thread().put((Future(), probe.close, ()))

    def ledger(self, topic: str) -> Ledger:
        """This lane's last committed ledger, once it fenced (offset 0 if it committed none)."""
        return self._read(self.group, topic)

    def _read(self, consumer: Any, topic: str) -> Ledger:
        from confluent_kafka import KafkaException, TopicPartition

        committed = self.within(consumer.committed, [TopicPartition(topic, 0)], TIMEOUT_S)[0]
        if committed.error is not None:  # never taken for "no ledger": the sink would write everything again
            raise KafkaException(committed.error)
        if committed.offset < 0:
            return Ledger({}, 0, None)
        positions, store = _ledger(committed.metadata)
        return Ledger(positions, committed.offset, store)

    def _thread(self) -> "queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]":
        if self._calls is None:
            self._calls = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(self._calls,), name=f"headrace-kafka-{self.txn_id}",
                             daemon=True).start()
            weakref.finalize(self, self._calls.put, None)  # a lane dropped unclosed ends its thread too
        return self._calls

    def close(self) -> None:
        """Close the consumer group and destroy the producer on the lane's thread, after any call it
        is stuck in: librdkafka's destroy, run where the producer's last reference goes, may wait on
        a broker, and the writer must not wait with it (the suspect when a clean clone's broker-restart
        test saw a driver go silent for good after its sink started its lanes again). So the handles
        go to the thread in a box it empties, and no frame of a failed call's traceback holds one
        (``within``, ``_run``): a cycle would be freed by the collector, on whatever thread it runs."""
        handles = [self.group, self.producer]
        self.group = self.producer = None
        if all(handle is None for handle in handles):
            return
        calls = self._thread()
        calls.put((Future(), _close, (handles,)))
        calls.put(None)  # nobody waits for it


def _close(handles: list[Any]) -> None:
    group, _producer = handles
    handles.clear()  # the producer's last reference is this frame's: it is destroyed as it returns
    try:
        if group is not None:
            group.close()
    except Exception:  # noqa: BLE001 - a group that cannot leave is let go all the same; raised, its
        pass  # traceback would hold the producer in a cycle that the collector frees on any thread


def _group_config(target: KafkaTarget, group: str, isolation: str) -> dict[str, Any]:
    """A ledger consumer's settings: the sink's ``config`` too, for what reaches the brokers
    (security, SASL, TLS; without it a sink on a cluster that asks for them never started), its
    producer settings ignored by librdkafka without a warning each (``log_level`` 3, errors only,
    unless ``config`` sets one)."""
    shared = {k: v for k, v in target.config.items() if k != "on_delivery"}  # confluent-kafka's, producers' only
    return {"log_level": 3, **shared, "bootstrap.servers": target.bootstrap_servers, "group.id": group,
            "isolation.level": isolation, "enable.auto.commit": False}


def abort(lane: Lane) -> None:
    """Abort the lane's open transaction on the way out of a failure, which it must not hide."""
    from confluent_kafka import KafkaException

    try:
        lane.within(lane.producer.abort_transaction, TIMEOUT_S)
    except (KafkaException, KafkaCommitError):
        pass  # the broker aborts it when its transaction.timeout.ms runs out, or the next writer's fence does


def _serve(calls: "queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]") -> None:
    while True:
        item = calls.get()
        if item is None:
            return
        _run(*item)
        del item  # an idle thread holds none of the handles it called


def _run(future: Future[Any], call: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if future.set_running_or_notify_cancel():
        try:
            future.set_result(call(*args))
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            del call, args  # the exception's traceback holds this frame, in a cycle with its future
