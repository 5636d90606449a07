"""The options of a Kafka sink (``Topology.sink(stream, kafka="topic", bootstrap_servers=...)``),
checked when the topology is built; the writer is ``spark/kafka_sink.py``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import OptionError

__all__ = ["KafkaTarget", "KAFKA_SINK_OPTIONS", "kafka_target", "SERIALIZERS", "KEYS"]

KAFKA_SINK_OPTIONS = ("kafka", "bootstrap_servers", "key", "serializer", "config", "lease_ms")

SERIALIZERS: dict[str, Callable[[Any], bytes]] = {
    "json": lambda value: json.dumps(value, separators=(",", ":")).encode(),
    "utf-8": lambda value: value.encode("utf-8"),
    "bytes": lambda value: bytes(value),
}
KEYS = ("id", "key")  # the message key: the record's id, or the key its producer gave

# librdkafka settings the sink owns: its exactly-once protocol depends on them
OWNED = ("transactional.id", "enable.idempotence", "transaction.timeout.ms", "bootstrap.servers")


@dataclass(frozen=True)
class KafkaTarget:
    topic: str
    bootstrap_servers: str
    key: str = "id"
    serializer: str | Callable[[Any], bytes] = "json"
    config: Mapping[str, Any] = field(default_factory=dict)
    lease_ms: int = 5_000

    def serialize(self, value: Any) -> bytes:
        encode = SERIALIZERS[self.serializer] if isinstance(self.serializer, str) else self.serializer
        return encode(value)


def kafka_target(stream: str, options: Mapping[str, Any]) -> KafkaTarget:
    """A Kafka sink's options, refused with a hint when one is wrong."""
    where = f"Kafka sink of stream {stream!r}"
    topic, servers = options.get("kafka"), options.get("bootstrap_servers")
    if not isinstance(topic, str) or not topic:
        raise OptionError(f"{where}: kafka= names the output topic", got=topic, hint="kafka='anomalies'")
    if not isinstance(servers, str) or not servers:
        raise OptionError(f"{where} needs bootstrap_servers", got=servers, hint="bootstrap_servers='127.0.0.1:9092'")
    key = options.get("key", "id")
    if key not in KEYS:
        raise OptionError(f"{where}: key must be one of {list(KEYS)}", got=key,
                          hint="key='id' (the record id, unique: downstream can dedup on it) or key='key' "
                               "(the key its producer gave, so one key's records share a partition)")
    serializer = options.get("serializer", "json")
    if not callable(serializer) and serializer not in SERIALIZERS:
        raise OptionError(f"{where}: unknown serializer", got=serializer,
                          hint=f"use one of {list(SERIALIZERS)} or a function of the value returning bytes")
    config = options.get("config") or {}
    if not isinstance(config, Mapping):
        raise OptionError(f"{where}: config must be a dict of librdkafka settings", got=config,
                          hint="config={'compression.type': 'lz4'}")
    owned = sorted(set(config) & set(OWNED))
    if owned:
        raise OptionError(f"{where}: the sink sets {owned[0]!r} itself", got=owned,
                          hint="drop it from config=: the transactional.id belongs to the sink (its fencing and "
                               "its ledger depend on it), and bootstrap_servers= names the brokers")
    lease_ms = options.get("lease_ms", 5_000)
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms < 100:
        raise OptionError(f"{where}: lease_ms must be an integer >= 100", got=lease_ms,
                          hint="e.g. lease_ms=5_000: a writer that stops renewing is replaced that long after")
    return KafkaTarget(topic, servers, key, serializer, dict(config), lease_ms)
