"""The Zeitgeist computations chained by hand on the harness (no Spark): what an anomaly reports.

tests/spark/test_zeitgeist.py runs the same pipeline on Spark in both modes and compares with
``harness_anomalies`` here.
"""

from __future__ import annotations

from typing import Any

from examples.zeitgeist.computations import WARMUP_BUCKETS, DipDetector, ModelCalculator, SpikeDetector, WindowCounter
from headrace.model import END_OF_TIME, Record
from headrace.testing import Harness

START = 1_767_225_600_000


def stage(cls: type, records: list[Record], stream: str) -> list[Record]:
    """Run one computation over ``records`` (keyed by their value's query) to the end of time."""
    h = Harness(cls, shards=1)
    for at in range(0, len(records), 1_000):  # in batches, as a runner reads them: one commit each, not one a record
        h.process_batch((r.value["query"], r.value, r.timestamp) for r in records[at:at + 1_000])
    h.advance_watermark(END_OF_TIME)
    return h.productions(stream)


def harness_anomalies(searches: list[dict[str, Any]]) -> dict[str, list[Record]]:
    """Every stream of the pipeline, from searches ``{"query", "ts"}`` given in event-time order."""
    counts = stage(WindowCounter, [Record(s["query"], s, s["ts"], "") for s in searches], "window_counts")
    scored = stage(ModelCalculator, counts, "scored")
    anomalies = stage(SpikeDetector, scored, "anomalies") + stage(DipDetector, scored, "anomalies")
    return {"window_counts": counts, "scored": scored, "anomalies": anomalies}


def searches(per_bucket: list[int], query: str = "q") -> list[dict[str, Any]]:
    """``per_bucket[i]`` searches for ``query`` spread over the i-th one-second bucket."""
    return [{"query": query, "ts": START + i * 1000 + j * (1000 // n)}
            for i, n in enumerate(per_bucket) for j in range(n)]


def test_a_dip_reports_its_first_buckets_measured_count_and_the_models_expectation() -> None:
    warm = WARMUP_BUCKETS + 5
    # a steady 30 a second, then two buckets far below it (4 and 1 <= 15% of 30), then steady again
    streams = harness_anomalies(searches([30] * warm + [4, 1] + [30] * 4))
    dip_bucket = START + warm * 1000
    assert [r.value for r in streams["anomalies"]] == [
        {"kind": "dip", "query": "q", "bucket": dip_bucket, "count": 4, "expected": 30.0}]
    scored = {r.value["bucket"]: r.value for r in streams["scored"]}
    assert scored[dip_bucket]["count"] == 4 and scored[dip_bucket]["expected"] == 30.0


def test_a_dip_of_empty_buckets_reports_count_zero_and_what_the_model_expected() -> None:
    warm = WARMUP_BUCKETS + 5
    per_bucket = [20 + i % 3 for i in range(warm)] + [0, 0, 0] + [20] * 3
    streams = harness_anomalies(searches(per_bucket))
    (dip,) = [r.value for r in streams["anomalies"]]
    scored = {r.value["bucket"]: r.value for r in streams["scored"]}[dip["bucket"]]
    assert dip == {"kind": "dip", "query": "q", "bucket": START + warm * 1000, "count": 0,
                   "expected": round(scored["expected"], 1)}
    assert 20 <= dip["expected"] <= 22  # the model learnt the steady rate, not None


def test_one_bucket_below_the_model_is_not_a_dip() -> None:
    warm = WARMUP_BUCKETS + 5
    streams = harness_anomalies(searches([30] * warm + [2] + [30] * 3))
    assert streams["anomalies"] == []
