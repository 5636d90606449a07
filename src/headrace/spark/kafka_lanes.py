"""A Kafka sink's transactional producers (*lanes*, spark/kafka_sink.py): each with the consumer
group its ledger commits under, its transactional calls on a daemon thread of its own so that one
that never returns can be given up (``within``), and which of Kafka's errors say the broker is
away or busy (``transient``), after which the sink starts its lanes again rather than end the run."""

from __future__ import annotations

import base64
import json
import queue
import threading
import zlib
from concurrent.futures import Future
from concurrent.futures import TimeoutError as CallTimedOut
from typing import Any, Callable

from ..errors import HeadraceError
from ..kafka_target import KafkaTarget

__all__ = ["KafkaCommitError", "Lane", "TIMEOUT_S", "METADATA_LIMIT", "abort", "transient", "loading",
           "encode_ledger", "decode_ledger"]

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


def encode_ledger(positions: dict[str, int]) -> str:
    return base64.b64encode(zlib.compress(json.dumps(positions, sort_keys=True).encode())).decode()


def decode_ledger(text: str | None) -> dict[str, int]:
    return {str(p): int(b) for p, b in json.loads(zlib.decompress(base64.b64decode(text))).items()} if text else {}


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
        if self._calls is None:
            self._calls = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(self._calls,), name=f"headrace-kafka-{self.txn_id}",
                             daemon=True).start()
        future: Future[Any] = Future()
        self._calls.put((future, call, args))
        try:
            return future.result(TIMEOUT_S + 1)
        except CallTimedOut:
            raise KafkaCommitError(f"Kafka did not answer the transactional producer {self.txn_id!r} within "
                                   f"{TIMEOUT_S + 1:.0f} s", got=getattr(call, "__name__", repr(call)),
                                   hint="the sink gives the producer up, starts a new one and resumes from its last "
                                        "committed batch") from None

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
        self.group = Consumer({"bootstrap.servers": target.bootstrap_servers, "group.id": self.txn_id,
                               "isolation.level": "read_committed", "enable.auto.commit": False})

    def ledger(self, topic: str) -> tuple[dict[str, int], int]:
        """This lane's last committed ledger and its offset (0 if it committed none)."""
        from confluent_kafka import TopicPartition

        committed = self.within(self.group.committed, [TopicPartition(topic, 0)], TIMEOUT_S)[0]
        if committed.offset < 0:
            return {}, 0
        return decode_ledger(committed.metadata), committed.offset

    def close(self) -> None:
        group, self.group = self.group, None
        if self._calls is None:
            if group is not None:
                group.close()
            return
        if group is not None:  # after the call the thread may be stuck in, like everything of the lane
            self._calls.put((Future(), group.close, ()))
        self._calls.put(None)  # its thread ends after those; nobody waits for it


def abort(lane: Lane) -> None:
    """Abort the lane's open transaction on the way out of a failure, which it must not hide."""
    from confluent_kafka import KafkaException

    try:
        lane.within(lane.producer.abort_transaction, TIMEOUT_S)
    except (KafkaException, KafkaCommitError):
        pass  # the broker aborts it when its transaction.timeout.ms runs out, or the next writer's fence does


def _serve(calls: "queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]") -> None:
    while (item := calls.get()) is not None:
        future, call, args = item
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(call(*args))
            except BaseException as exc:
                future.set_exception(exc)
