"""A Kafka sink's options (``Topology.sink(stream, kafka=...)``), checked where they are written."""

from __future__ import annotations

import re

import pytest

from headrace import Topology
from headrace.errors import OptionError


def exact(text: str) -> str:
    return "^" + re.escape(text) + "$"


def topology() -> Topology:
    t = Topology("sinks")
    t.inject("words", [{"w": "a"}])
    return t


def test_a_kafka_sink_is_declared_with_its_topic_and_brokers() -> None:
    spec = topology().sink("words", kafka="out", bootstrap_servers="127.0.0.1:9092", key="key",
                           config={"compression.type": "lz4"})
    assert (spec.name, spec.kind) == ("words-kafka", "kafka")
    assert spec.kafka is not None and (spec.kafka.topic, spec.kafka.key, spec.kafka.lease_ms) == ("out", "key", 5_000)
    assert spec.kafka.serialize({"w": "a"}) == b'{"w":"a"}'


@pytest.mark.parametrize("options, message", [
    ({"kafka": "out"}, "Sink of stream 'words' needs option 'bootstrap_servers' (got ['kafka']). Hint: a kafka sink "
                       "takes ['kafka', 'bootstrap_servers', 'key', 'serializer', 'config', 'lease_ms']"),
    ({"kafka": "", "bootstrap_servers": "h:1"},
     "Kafka sink of stream 'words': kafka= names the output topic (got ''). Hint: kafka='anomalies'"),
    ({"kafka": "out", "bootstrap_servers": "h:1", "key": "user"},
     "Kafka sink of stream 'words': key must be one of ['id', 'key'] (got 'user'). Hint: key='id' (the record id, "
     "unique: downstream can dedup on it) or key='key' (the key its producer gave, so one key's records share a "
     "partition)"),
    ({"kafka": "out", "bootstrap_servers": "h:1", "serializer": "avro"},
     "Kafka sink of stream 'words': unknown serializer (got 'avro'). Hint: use one of ['json', 'utf-8', 'bytes'] "
     "or a function of the value returning bytes"),
    ({"kafka": "out", "bootstrap_servers": "h:1", "config": {"transactional.id": "mine"}},
     "Kafka sink of stream 'words': the sink sets 'transactional.id' itself (got ['transactional.id']). Hint: drop "
     "it from config=: the transactional.id belongs to the sink (its fencing and its ledger depend on it), and "
     "bootstrap_servers= names the brokers"),
    ({"kafka": "out", "bootstrap_servers": "h:1", "lease_ms": 0},
     "Kafka sink of stream 'words': lease_ms must be an integer >= 100 (got 0). Hint: e.g. lease_ms=5_000: a "
     "writer that stops renewing is replaced that long after"),
])
def test_a_bad_kafka_sink_is_refused_word_for_word(options: dict, message: str) -> None:
    with pytest.raises(OptionError, match=exact(message)):
        topology().sink("words", **options)
