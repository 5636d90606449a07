"""Zeitgeist over Kafka (``scripts/demo --kafka``): the searches come from a Kafka topic and the
anomalies go to one, through headrace's exactly-once Kafka sink.

The demo starts a one-node Apache Kafka broker itself (KRaft, on 127.0.0.1, from the jars
``scripts/ensure-kafka`` caches; Java 17+ and Maven the first time), creates the topics
``searches`` (3 partitions, keyed by query) and ``anomalies``, produces the scenario's searches
into the first, and at the end reads the second back as a ``read_committed`` consumer.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from headrace import Topology, injectors

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.kafka_broker
from tests.kafka_broker import KafkaBroker  # noqa: E402

SEARCHES, ANOMALIES = "searches", "anomalies"


def start_broker() -> KafkaBroker:
    broker = KafkaBroker().start()
    broker.create_topic(SEARCHES, partitions=3)
    broker.create_topic(ANOMALIES, partitions=1)
    return broker


def fill(bootstrap: str, events: list[dict[str, Any]]) -> None:
    """Every search as a JSON message keyed by its query, in the order they were generated."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for e in events:
        while True:
            try:
                producer.produce(SEARCHES, json.dumps(e).encode(), key=e["query"].encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def source(bootstrap: str, disorder_ms: int) -> Any:
    """The searches topic as a bounded injector: it ends once every partition is read to its end."""
    return injectors.kafka(SEARCHES, bootstrap, parts=3, timestamp="ts", max_delay_ms=disorder_ms, bounded=True,
                           batch_size=1_000)


def sink(topology: Topology, bootstrap: str) -> None:
    topology.sink("anomalies", kafka=ANOMALIES, bootstrap_servers=bootstrap)


def read_anomalies(bootstrap: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The anomalies topic as a read_committed consumer sees it, read to its end."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "zeitgeist-demo", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([TopicPartition(ANOMALIES, 0, OFFSET_BEGINNING)])
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error, value = message.error(), message.value()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                raise RuntimeError(f"reading {ANOMALIES}: {error}")
            if value is None:
                raise RuntimeError(f"reading {ANOMALIES}: a message without a value at offset {message.offset()}")
            found.append(json.loads(value))
    finally:
        consumer.close()
    return found
