from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by, read, run
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
        path = folder / f"part-{i:05d}.json"
        path.write_text("\n".join(json.dumps(e) for e in events[i:i + 300]))
        # Spark's file source takes files oldest first: equal mtimes would let a later file come first,
        # and its records would put the watermark past the earlier files' (late, dropped)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
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
        # the slow part publishes for 8 s, so the consumer runs several batches even when its query starts late
        injectors.records(slow, timestamp="ts", batch_size=40, rate=100)))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, trigger_ms=100, mode="microbatch")
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


class CountIds(Computation):
    """Per key: every record id it was given, in arrival order."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = [*(ctx.state or []), record.id]

    def process_timer(self, ctx: Any, timer: Any) -> None:  # pragma: no cover - sets none
        pass


@pytest.mark.parametrize(("delivery", "mode"), [("at_least_once", "continuous"), ("exactly_once", "continuous"),
                                               ("at_least_once", "microbatch")])
def test_a_stream_injected_at_least_once_is_deduplicated_by_record_id(spark: Any, store_url: str, delivery: str,
                                                                      mode: str) -> None:
    # a source that sends some records again, with the same id, in later batches (as after a retry)
    events = [{"user": f"u{i % 7}", "ts": 1_000 + i, "id": f"e{i}"} for i in range(300)]
    repeats = [dict(e) for e in events[::10]]
    t = Topology(f"repeats_{delivery}_{mode}")
    t.inject("events", injectors.records(events + repeats, timestamp="ts", id=lambda v: v["id"], batch_size=50),
             delivery=delivery)
    t.add(CountIds, inputs={"events": key_by("user")}, shards=3)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)

    store = open_store(store_url)
    seen = {u: pickle.loads(store.state("CountIds", u)) for u in {e["user"] for e in events}}
    expected = {u: sorted(e["id"] for e in events if e["user"] == u) for u in seen}
    if delivery == "at_least_once":
        assert {u: sorted(ids) for u, ids in seen.items()} == expected
        assert store.counters("CountIds")["duplicates"] == len(repeats)
    else:  # the source promised no repeats, so nothing checks: each repeat is delivered again
        assert sum(map(len, seen.values())) == len(events) + len(repeats)
        assert "duplicates" not in store.counters("CountIds")
