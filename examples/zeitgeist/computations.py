"""The Zeitgeist pipeline of the MillWheel paper (section 2, Figures 1, 2 and 9)."""

from __future__ import annotations

import math
from typing import Any

from headrace import Computation
from headrace.model import END_OF_TIME

WARMUP_BUCKETS = 20
IDLE_BUCKETS = 120


class WindowCounter(Computation):
    """Searches per query and one-second bucket, emitted once the low watermark passes the bucket.

    After each bucket it keeps a timer on the next one, so an empty bucket (a dip) is emitted too.
    """

    def process_record(self, ctx: Any, record: Any) -> None:
        state = ctx.state or {"counts": {}, "idle": 0}
        bucket = record.timestamp - record.timestamp % 1000
        state["counts"][bucket] = state["counts"].get(bucket, 0) + 1
        state["idle"] = 0
        ctx.state = state
        ctx.set_timer(f"bucket-{bucket}", bucket + 1000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        state = ctx.state
        bucket = timer.timestamp - 1000
        count = state["counts"].pop(bucket, 0)
        if count == 0 and not state["counts"] and ctx.low_watermark == END_OF_TIME:
            ctx.state = state  # the input has ended and nothing is left to count
            return
        ctx.produce("window_counts", {"query": ctx.key, "bucket": bucket, "count": count})
        state["idle"] = state["idle"] + 1 if count == 0 else 0
        if state["idle"] < IDLE_BUCKETS:
            ctx.set_timer(f"bucket-{bucket + 1000}", bucket + 2000)
        ctx.state = state


class ModelCalculator(Computation):
    """A per-query model of the expected count per bucket (an exponentially weighted mean and
    variance), kept in persistent state; scores each bucket against the model before learning it.
    Anomalous buckets are not learnt, so a spike does not teach the model to expect spikes."""

    alpha = 0.15

    def process_record(self, ctx: Any, record: Any) -> None:
        v = record.value
        model = ctx.state or {"mean": float(v["count"]), "var": float(v["count"]), "n": 0}
        std = math.sqrt(model["var"] + model["mean"] + 1.0)
        z = (v["count"] - model["mean"]) / std
        ctx.produce("scored", {**v, "expected": model["mean"], "std": std, "z": z, "warm": model["n"] >= WARMUP_BUCKETS})
        if abs(z) < 4 or model["n"] < WARMUP_BUCKETS:
            delta = v["count"] - model["mean"]
            model["mean"] += self.alpha * delta
            model["var"] = (1 - self.alpha) * (model["var"] + self.alpha * delta * delta)
            model["n"] += 1
        ctx.state = model


class SpikeDetector(Computation):
    """No timers: a spike is evident without a complete picture. One anomaly per run of spiky buckets."""

    def process_record(self, ctx: Any, record: Any) -> None:
        v = record.value
        spiking = v["warm"] and v["z"] > 5 and v["count"] >= v["expected"] + 10
        was = bool(ctx.state)
        if spiking and not was:
            ctx.produce("anomalies", {"kind": "spike", "query": ctx.key, "bucket": v["bucket"],
                                      "count": v["count"], "expected": round(v["expected"], 1)})
        if spiking != was:
            ctx.state = True if spiking else None


class DipDetector(Computation):
    """Watermark timers: a bucket is judged only once the low watermark has passed it, so buckets
    are judged in order with a complete picture. A dip is two empty-looking buckets in a row; one
    anomaly per run of dipping buckets, reporting the first bucket's count and what the model
    expected of it."""

    def process_record(self, ctx: Any, record: Any) -> None:
        v = record.value
        state = ctx.state or {"pending": {}, "previous": None, "in_dip": False}
        low = v["warm"] and v["expected"] >= 6 and v["count"] <= 0.15 * v["expected"]
        state["pending"][v["bucket"]] = {"low": low, "bucket": v["bucket"], "count": v["count"],
                                         "expected": round(v["expected"], 1)}
        ctx.state = state
        ctx.set_timer(f"bucket-{v['bucket']}", v["bucket"] + 1000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        state = ctx.state
        judged = state["pending"].pop(timer.timestamp - 1000, None)
        low = judged is not None and judged["low"]
        previous = state["previous"]  # the bucket judged just before, if it looked empty
        if low and previous is not None and not state["in_dip"]:
            state["in_dip"] = True
            ctx.produce("anomalies", {"kind": "dip", "query": ctx.key, "bucket": previous["bucket"],
                                      "count": previous["count"], "expected": previous["expected"]})
        state["in_dip"] = state["in_dip"] and low
        state["previous"] = judged if low else None
        ctx.state = state
