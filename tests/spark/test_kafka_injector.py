"""injectors.kafka on Spark, in both modes: a 3-partition topic read by two injector parts into a
keyed window count, exact against the oracle; each part's journal carries its partitions' offsets."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer

from headrace import Topology, injectors, key_by, read, run
from headrace.store import open_store

from .pipelines import WindowCounter, oracle, searches


def test_a_kafka_topic_is_injected_exactly_once(spark: Any, store_url: str, mode: str, kafka_broker: Any) -> None:
    events = searches(900, seed=57)
    topic = kafka_broker.create_topic(partitions=3)
    # idempotent: a retried request must not reorder a partition (the bad record once landed at offset 187)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "enable.idempotence": True})
    for i, event in enumerate(events):
        producer.produce(topic, json.dumps(event).encode(), partition=i % 3)
    producer.produce(topic, b"\xff not json", partition=1)
    assert producer.flush(30) == 0
    t = Topology(f"kafka_{mode}")
    t.inject("searches", injectors.kafka(topic, kafka_broker.bootstrap_servers, parts=2, timestamp="ts",
                                         max_delay_ms=3_000, idle_ms=600_000, batch_size=200, bounded=True))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    counts = {(r.value["query"], r.value["bucket"]): r.value["count"] for r in read("window_counts", store_url)}
    assert counts == oracle(events)["window_counts"]
    store = open_store(store_url)
    offsets = {}
    for part in ("inject:searches/0", "inject:searches/1"):
        offsets.update(json.loads(store.checkpoint(part))["partitions"])
    assert {p: o for p, (o, _, _) in offsets.items()} == {"0": 300, "1": 301, "2": 300}
    letters = [r.value for r in read("searches.dead_letter", store_url)]
    assert [(d["partition"], d["offset"], d["value"]) for d in letters] == [(1, 300, b"\xff not json")]
