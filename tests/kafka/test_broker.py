"""The test broker itself: a transactional producer's records reach a read_committed consumer, an
aborted transaction's do not."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer


def test_the_broker_serves_transactions(kafka_broker):
    topic = kafka_broker.create_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "transactional.id": "smoke"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"kept", partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"dropped", partition=1)
    producer.abort_transaction(30)
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "smoke",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    seen = []
    for _ in range(40):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append(message.value())
        if seen:
            break
    consumer.close()
    assert seen == [b"kept"]
