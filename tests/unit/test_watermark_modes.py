"""The input low watermark of a computation is the same whichever runtime reads its input: the
continuous worker (what its interval commits and quiet reports journal), the micro-batch
source (the watermark after a batch its tasks carry) and the harness (an injected batch), over
the same journal; no SparkSession needed (engine/intake.py ``input_watermark``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by
from headrace.engine.publish import publish_injected
from headrace.engine.worker import Worker
from headrace.model import BEGINNING_OF_TIME
from headrace.names import CONTINUOUS, MICROBATCH
from headrace.plans import consumer_of, interval_plans, producers_of, routing_plan
from headrace.spark.source import HeadraceReader, ShardPlan, encode_plan
from headrace.store import open_store
from headrace.testing import Harness


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("out", record.value)


def topology(parts: int, percentile: float | None) -> Topology:
    t = Topology("marks")
    source = (injectors.several(*[injectors.records([], timestamp="ts") for _ in range(parts)]) if parts > 1
              else injectors.records([], timestamp="ts"))
    t.inject("events", source)
    options = {"watermark_percentile": {"events": percentile}} if percentile else {}
    t.add(Echo, inputs={"events": key_by("user")}, outputs=["out"], shards=3, **options)
    return t


# each part's batches: the watermark each one publishes (a part with none has published nothing)
JOURNALS = [
    [[100, 200], [150]],
    [[100, 200], []],
    [[500], [40, 60, 80], [700]],
]


def publish_parts(url: str, t: Topology, journals: list[list[int]]) -> list[str]:
    store = open_store(url)
    plan = routing_plan(t)
    store.register_plan(plan.id, plan.routes)
    producers = list(t.injections["events"].producers)
    for producer, marks in zip(producers, journals):
        for batch, mark in enumerate(marks, start=1):
            publish_injected(store, producer, batch, "events", [({"user": f"u{batch}", "ts": mark}, mark, None)],
                             mark, None, None, plan, 1)
    store.close()
    return producers


def continuous_watermark(url: str, t: Topology) -> int:
    store = open_store(url)
    store.register("Echo", 3, CONTINUOUS)
    for s in sorted(t.streams()):
        store.declare_stream(s, *producers_of(t, s, CONTINUOUS))
    worker = Worker(store, interval_plans(t), "w", 0, 1)
    worker.maintain_leases()
    worker.step()
    mark = store.low_watermarks("Echo")[0]
    store.close()
    return mark


def microbatch_watermark(url: str, t: Topology) -> int:
    checkpoint = url[len("sqlite:///"):] + ".checkpoint"
    reader = HeadraceReader({"store": url, "plan": encode_plan(ShardPlan(consumer_of(t, "Echo", MICROBATCH), Echo)),
                             "checkpoint": checkpoint, "start": "beginning", "parallelism": "2"})
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start)
        os.makedirs(os.path.join(checkpoint, "offsets"))
        with open(os.path.join(checkpoint, "offsets", "0"), "w") as f:  # as Spark logs the batch before planning it
            f.write(json.dumps(end))
        parts = reader.partitions(start, end)
        return int(parts[0].control[1])  # type: ignore[attr-defined]
    finally:
        reader.stop()


@pytest.mark.parametrize("journals", JOURNALS)
@pytest.mark.parametrize("percentile", [None, 50.0])
def test_both_runtimes_take_the_same_input_watermark_from_the_same_journal(
        tmp_path: Path, journals: list[list[int]], percentile: float | None) -> None:
    t = topology(len(journals), percentile)
    url = f"sqlite:///{tmp_path}/store.db"
    publish_parts(url, t, journals)
    expected = min(m[-1] if m else BEGINNING_OF_TIME for m in journals)
    if percentile is not None:  # the slowest half of the parts is ignored
        ordered = sorted(m[-1] if m else BEGINNING_OF_TIME for m in journals)
        expected = ordered[min(int(len(ordered) * 0.5), len(ordered) - 1)]
    assert microbatch_watermark(url, t) == expected
    assert continuous_watermark(url, t) == expected


def test_the_harness_takes_the_injectors_watermark_as_the_runtimes_do(tmp_path: Path) -> None:
    h = Harness(Echo, outputs=["out"], shards=3)
    h.inject("events", [{"user": "a", "ts": 10}], key=key_by("user"), timestamp="ts", watermark=150)
    t = topology(1, None)
    url = f"sqlite:///{tmp_path}/store.db"
    publish_parts(url, t, [[150]])
    assert h.low_watermark == microbatch_watermark(url, t) == continuous_watermark(url, t) == 150
