from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headrace import Topology, injectors, key_by, read, run
from headrace.store import open_store

from .pipelines import WindowCounter, oracle, searches


def window_counts(store_url: str) -> dict[tuple[str, int], int]:
    return {(r.value["query"], r.value["bucket"]): r.value["count"] for r in read("window_counts", store_url)}


def test_a_streaming_dataframe_is_an_injector_with_a_declared_watermark_policy(
        spark: Any, store_url: str, tmp_path: Path) -> None:
    events = searches(1_200, seed=31, disorder_ms=2_000)
    folder = tmp_path / "incoming"
    folder.mkdir()
    for i in range(0, len(events), 300):
        (folder / f"part-{i:05d}.json").write_text("\n".join(json.dumps(e) for e in events[i:i + 300]))
    df = spark.readStream.schema("query STRING, ts BIGINT").option("maxFilesPerTrigger", 1).json(str(folder))
    t = Topology("from_dataframe")
    t.inject("searches", df, timestamp="ts", max_delay_ms=2_000, bounded=True)
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300)
    assert window_counts(store_url) == oracle(events)["window_counts"]
    journal = open_store(store_url).batches("inject:searches")
    assert len(journal) >= 4  # one published batch per Spark micro-batch, then the end of time


def test_an_injector_of_several_parts_holds_the_watermark_at_their_minimum(spark: Any, store_url: str) -> None:
    events = searches(1_600, seed=41)
    fast = [e for i, e in enumerate(events) if i % 2 == 0]
    slow = [e for i, e in enumerate(events) if i % 2 == 1]
    t = Topology("parts")
    t.inject("searches", injectors.several(
        injectors.records(fast, timestamp="ts", batch_size=200),
        injectors.records(slow, timestamp="ts", batch_size=40, rate=400)))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, trigger_ms=100)
    assert window_counts(store_url) == oracle(events)["window_counts"]

    store = open_store(store_url)
    parts = [store.batches("inject:searches/0"), store.batches("inject:searches/1")]
    assert all(parts) and not store.batches("inject:searches")
    consumer = store.batches("WindowCounter")
    assert len(consumer) >= 2
    for b in consumer:
        for part in parts:
            published = [p.output_watermark for p in part if p.completed_at <= b.completed_at]
            assert published and b.input_watermark <= max(published), "consumer passed a part's watermark"
