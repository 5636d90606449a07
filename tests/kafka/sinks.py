"""What the Kafka sink tests share: publishing batches to a store, and reading a topic to its end
as a ``read_committed`` consumer."""

from __future__ import annotations

from typing import Any, NamedTuple

from headrace.engine.batch import Production
from headrace.names import injector
from headrace.store import open_store


class Message(NamedTuple):
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    partition: int


def publish(store_url: str, stream: str, batches: range, per_batch: int) -> list[str]:
    """Journal ``batches`` of ``per_batch`` records each (value ``{"n": ...}``); their record ids."""
    producer = injector(stream)
    store = open_store(store_url)
    ids = []
    try:
        store.declare_stream(stream, producer)
        for b in batches:
            records = [Production(stream, f"k{n % 5}", {"n": n}, 1_000 + n, f"{producer}:{b}:{i}")
                       for i, n in enumerate(range(b * per_batch, (b + 1) * per_batch))]
            store.publish(producer, b, {stream: records}, 1_000 + (b + 1) * per_batch)
            ids.extend(r.id for r in records)
    finally:
        store.close()
    return ids


def read_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[Message]:
    """Every message of ``topic`` a ``read_committed`` consumer sees, read to each partition's end."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "headrace-test-reader",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    partitions = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    seen: list[Message] = []
    ended: set[int] = set()
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while ended != set(partitions):
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout_s} s"
            for m in consumer.consume(500, 0.2):
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    ended.add(m.partition())
                    continue
                ended.discard(m.partition())
                seen.append(Message(m.key(), m.value(), {k: v for k, v in (m.headers() or [])}, m.partition()))
    finally:
        consumer.close()
    return seen


def ids_of(messages: list[Message]) -> list[str]:
    return [m.headers["headrace.id"].decode() for m in messages]


def exactly_once(messages: list[Message], expected: list[str]) -> Any:
    """None when ``messages`` hold every expected id once and nothing else; else what differs."""
    got = ids_of(messages)
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    doubled = sorted({i for i in got if got.count(i) > 1}) if len(got) != len(set(got)) else []
    return None if not (missing or extra or doubled) else {"missing": missing[:5], "extra": extra[:5],
                                                           "doubled": doubled[:5], "counts": (len(got), len(expected))}
