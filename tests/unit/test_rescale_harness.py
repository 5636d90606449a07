"""Rescaling on the Harness (docs/architecture.md §3.6): the three-stage oracle pipeline, one
Harness per stage, every stage at 4 shards, stopped while watermark timers are pending; a process
SIGKILLed inside the change to 7; 7 shards; then 2 to the end. Every stage is re-created on the
same store with the new count, as a restarted driver would register it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrace.model import END_OF_TIME
from headrace.testing import Harness
from tests.spark.pipelines import BucketTotals, BusiestBucketPerTenSeconds, WindowCounter, searches
from tests.spark.rescaling import (STAGES, check_against_the_oracle, counted_once, kill_inside_the_change,
                                   pending_watermark_timers, shard_counts)

CHUNK = 100
KEYS = (lambda v: v["query"], lambda v: str(v["bucket"]), lambda v: str(v["bucket"] - v["bucket"] % 10_000))


def stages(url: str, shards: int) -> list[Harness]:
    return [Harness(cls, name=name, store=url, shards=shards)
            for cls, name in zip((WindowCounter, BucketTotals, BusiestBucketPerTenSeconds), STAGES)]


def feed(pipeline: list[Harness], events: list[dict[str, Any]], start: int, end: int) -> None:
    """Events [start, end) in chunks; after each, every stage's watermark moves to the oldest
    timestamp not yet injected (as the records injector promises)."""
    for lo in range(start, end, CHUNK):
        chunk = list(enumerate(events[lo:min(lo + CHUNK, end)], lo))
        rest = events[lo + len(chunk):]
        watermark = min((e["ts"] for e in rest), default=END_OF_TIME)
        out = [r for i, e in chunk for r in pipeline[0].process(e["query"], e, e["ts"], id=f"searches:{i}")]
        out += pipeline[0].advance_watermark(watermark)
        for stage, key in zip(pipeline[1:], KEYS[1:]):
            produced = [p for r in out for p in stage.process(key(r.value), r.value, r.timestamp, id=r.id)]
            out = produced + stage.advance_watermark(watermark)


def test_rescaling_4_to_7_to_2_on_the_harness_equals_the_oracle(tmp_path: Path) -> None:
    """On SQLite (tests/unit/store/test_rescale.py runs the change itself on both stores)."""
    url = f"sqlite:///{tmp_path}/store.db"
    events = searches(500, seed=9)
    feed(stages(url, 4), events, 0, 200)
    assert shard_counts(url) == dict.fromkeys(STAGES, 4)
    assert pending_watermark_timers(url) > 0
    counted_once(url, 200)

    kill_inside_the_change(url, 7, tmp_path / "marks")
    counted_once(url, 200)
    feed(stages(url, 7), events, 200, 400)
    assert shard_counts(url) == dict.fromkeys(STAGES, 7)
    assert pending_watermark_timers(url) > 0
    counted_once(url, 400)

    feed(stages(url, 2), events, 400, len(events))
    assert shard_counts(url) == dict.fromkeys(STAGES, 2)
    check_against_the_oracle(url, events)
