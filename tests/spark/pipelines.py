"""Computations and plain-Python oracles shared by the Spark tests."""

from __future__ import annotations

import operator
import random
from collections import Counter, defaultdict
from typing import Any

from headrace import Computation, Topology, injectors, key_by
from headrace.model import END_OF_TIME
from headrace.monoids import constant, field, tumbling

from ..monoids import Adding

BASE = 1_700_000_000_000


class WindowCounter(Computation):
    """Searches per query and one-second bucket, emitted once the low watermark passes the bucket."""

    def process_record(self, ctx: Any, record: Any) -> None:
        counts = ctx.state or {}
        bucket = record.timestamp - record.timestamp % 1000
        counts[bucket] = counts.get(bucket, 0) + 1
        ctx.state = counts
        ctx.set_timer(f"bucket-{bucket}", bucket + 1000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        counts = ctx.state
        bucket = timer.timestamp - 1000
        ctx.produce("window_counts", {"query": ctx.key, "bucket": bucket, "count": counts.pop(bucket)})
        ctx.state = counts or None


class BucketTotals(Computation):
    """Keyed by bucket: the total over every query, and how many queries it saw, once complete."""

    def process_record(self, ctx: Any, record: Any) -> None:
        total = ctx.state or {"searches": 0, "queries": 0}
        total["searches"] += record.value["count"]
        total["queries"] += 1
        ctx.state = total
        ctx.set_timer("complete", record.value["bucket"] + 1000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("bucket_totals", {"bucket": int(ctx.key), **ctx.state})
        ctx.state = None


class BusiestBucketPerTenSeconds(Computation):
    """Keyed by ten-second span: the bucket with the most searches, once the span is complete."""

    def process_record(self, ctx: Any, record: Any) -> None:
        best = ctx.state
        v = record.value
        if best is None or (v["searches"], -v["bucket"]) > (best["searches"], -best["bucket"]):
            ctx.state = {"bucket": v["bucket"], "searches": v["searches"]}
        ctx.set_timer("span", int(ctx.key) + 10_000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("busiest", {"span": int(ctx.key), **ctx.state})
        ctx.state = None


def searches(n: int, seed: int = 3, spread_ms: int = 40_000, disorder_ms: int = 3_000) -> list[dict[str, Any]]:
    """Zipf-ish queries over ``spread_ms``, arriving out of order by up to ``disorder_ms``."""
    rng = random.Random(seed)
    queries = [f"q{i}" for i in range(30)]
    weights = [1 / (i + 1) for i in range(len(queries))]
    events = [{"query": rng.choices(queries, weights)[0], "ts": BASE + rng.randrange(spread_ms)} for _ in range(n)]
    events.sort(key=lambda e: e["ts"] + rng.randrange(disorder_ms))
    return events


def three_stage(events: list[dict[str, Any]], batch_size: int = 400, name: str = "three_stage",
                rate: float | None = None, **options: Any) -> Topology:
    """Three stages, each added with ``options`` too."""
    t = Topology(name)
    t.inject("searches", injectors.records(events, timestamp="ts", batch_size=batch_size, rate=rate))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=3, **options)
    t.add(BucketTotals, inputs={"window_counts": key_by(lambda v: str(v["bucket"]))}, outputs=["bucket_totals"], shards=2,
          **options)
    t.add(BusiestBucketPerTenSeconds, inputs={"bucket_totals": key_by(lambda v: str(v["bucket"] - v["bucket"] % 10_000))},
          outputs=["busiest"], shards=2, **options)
    return t


def oracle(events: list[dict[str, Any]]) -> dict[str, Any]:
    window = Counter((e["query"], e["ts"] - e["ts"] % 1000) for e in events)
    totals: dict[int, dict[str, int]] = defaultdict(lambda: {"searches": 0, "queries": 0})
    for (_, bucket), count in window.items():
        totals[bucket]["searches"] += count
        totals[bucket]["queries"] += 1
    busiest: dict[int, dict[str, int]] = {}
    for bucket, total in sorted(totals.items()):
        span = bucket - bucket % 10_000
        best = busiest.get(span)
        if best is None or total["searches"] > best["searches"]:
            busiest[span] = {"bucket": bucket, "searches": total["searches"]}
    return {
        "window_counts": {(q, b): c for (q, b), c in window.items()},
        "bucket_totals": {b: dict(t) for b, t in totals.items()},
        "busiest": busiest,
    }


# -- monoid computations beside their plain versions (tests/spark/test_monoid.py) -------------------

class PlainCount(Computation):
    """Records per key, emitted once the input has ended."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("end", END_OF_TIME)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("plain_counts", {"key": ctx.key, "count": ctx.state})
        ctx.state = None


class MonoidCount(Adding):
    """The same count as a monoid: one window per key (the default), emitted once the input has ended."""

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("monoid_counts", {"key": ctx.key, "count": aggregate})


class PlainWindowSum(Computation):
    """The sum of ``n`` per key and one-second window, emitted once the window is complete."""

    def process_record(self, ctx: Any, record: Any) -> None:
        sums = ctx.state or {}
        end = record.timestamp - record.timestamp % 1000 + 1000
        sums[end] = sums.get(end, 0) + record.value["n"]
        ctx.state = sums
        ctx.set_timer(f"w{end}", end)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        sums = ctx.state
        ctx.produce("plain_sums", {"key": ctx.key, "end": timer.timestamp, "sum": sums.pop(timer.timestamp)})
        ctx.state = sums or None


class MonoidWindowSum(Adding):
    def lift(self, record: Any) -> int:
        return int(record.value["n"])

    def combine(self, a: int, b: int) -> int:
        return a + b

    def window(self, record: Any) -> int:
        return record.timestamp - record.timestamp % 1000 + 1000

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("monoid_sums", {"key": ctx.key, "end": timer.timestamp, "sum": aggregate})


class BuiltinCount(MonoidCount):
    """The count from ``headrace.monoids``' hooks: folded from a typed stream's field columns."""

    lift = constant(1)
    combine = operator.add

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("builtin_counts", {"key": ctx.key, "count": aggregate})


class BuiltinWindowSum(MonoidCount):
    """The windowed sum from ``headrace.monoids``' hooks: folded from a typed stream's field columns."""

    lift = field("n")
    window = tumbling(1000)
    combine = operator.add

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("builtin_sums", {"key": ctx.key, "end": timer.timestamp, "sum": aggregate})


EVENT_SCHEMA = "key STRING, n BIGINT, ts BIGINT"


def skewed_events(n: int, keys: int = 200, seed: int = 11) -> list[dict[str, Any]]:
    """Zipf-skewed keys over 20 s of event time, out of order by up to 2 s, each with a number ``n``."""
    rng = random.Random(seed)
    names = [f"k{i}" for i in range(keys)]
    weights = [1 / (i + 1) for i in range(keys)]
    events = [{"key": k, "n": rng.randrange(100), "ts": BASE + rng.randrange(20_000)}
              for k in rng.choices(names, weights, k=n)]
    events.sort(key=lambda e: e["ts"] + rng.randrange(2_000))
    return events


def monoid_beside_plain(events: list[dict[str, Any]], batch_size: int = 300, typed: bool = False) -> Topology:
    """Plain and monoid counts and window sums of ``events``; ``typed``: the events are a typed
    stream, and the built-in monoids (folded from its field columns) run beside them too."""
    t = Topology("monoid_beside_plain")
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=batch_size))
    variants = [(PlainCount, "plain_counts"), (MonoidCount, "monoid_counts"),
                (PlainWindowSum, "plain_sums"), (MonoidWindowSum, "monoid_sums")]
    if typed:
        t.stream("events", schema=EVENT_SCHEMA)
        variants += [(BuiltinCount, "builtin_counts"), (BuiltinWindowSum, "builtin_sums")]
    for cls, out in variants:
        t.add(cls, inputs={"events": key_by("key")}, outputs=[out], shards=2)
    return t


def monoid_oracle(events: list[dict[str, Any]]) -> dict[str, Any]:
    sums: Counter[tuple[str, int]] = Counter()
    for e in events:
        sums[(e["key"], e["ts"] - e["ts"] % 1000 + 1000)] += e["n"]
    return {"counts": dict(Counter(e["key"] for e in events)), "sums": dict(sums)}
