"""The driver's monitor round without Spark: samples, and lag alerts raised once and cleared once."""

from __future__ import annotations

import json
import time
from typing import Any

import headrace
from headrace import Computation
from headrace.monitor.watch import Watcher
from headrace.testing import Harness


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def stage(lag: int | None, threshold: int | None = 1_000) -> dict[str, Any]:
    return {"stages": {"Count": {"alert_lag_ms": threshold, "watermark_lag_ms": lag, "output_watermark": 5}}}


def test_an_alert_is_raised_once_while_the_lag_is_over_and_cleared_once_it_is_back() -> None:
    h = Harness(Count)
    watcher = Watcher(h.store.url)
    changes = [watcher.check_alerts(h.store, stage(lag), at) for at, lag in
               [(1, 500), (2, 1_000), (3, 1_001), (4, 5_000), (5, None), (6, 999), (7, 200), (8, 2_000)]]
    assert changes == [False, False, True, False, False, True, False, True]
    events = [(e.at, e.kind, json.loads(e.detail)["lag_ms"]) for e in h.store.events()]
    assert events == [(3, "alert", 1_001), (6, "cleared", 999), (8, "alert", 2_000)]
    assert headrace.status(h.store.url)["alerts"] == [
        {"stage": "Count", "raised_at": 8, "threshold_ms": 1_000, "lag_ms": 2_000, "output_watermark": 5}]
    assert not Watcher(h.store.url).check_alerts(h.store, stage(9_999, threshold=None), 9)


def test_a_round_writes_a_sample_per_stage_and_status_derives_records_per_second_from_them() -> None:
    h = Harness(Count)
    watcher = Watcher(h.store.url)
    watcher.round(h.store)
    for _ in range(30):
        h.process("k", "v", 1)
    h.store.add_samples([s._replace(at=s.at + 2_000, records=30) for s in h.store.samples(0)])
    now = h.store.samples(0)[-1].at
    assert headrace.status(h.store.url, now_ms=now)["stages"]["Count"]["records_per_s"] == 15.0
    assert headrace.status(h.store.url, now_ms=now + 60_000)["stages"]["Count"]["records_per_s"] is None


def test_a_slow_round_spaces_the_next_one_out(tmp_path: Any) -> None:
    """A round that takes long (status() reads one row per interval) waits three times its length
    before the next, so the monitor takes at most a quarter of its thread's time."""
    starts: list[tuple[float, float]] = []  # (start, end) of each round

    class Slow(Watcher):
        def round(self, store: Any) -> dict[str, Any]:
            began = time.monotonic()
            time.sleep(0.1)
            starts.append((began, time.monotonic()))
            return {}

    watcher = Slow(f"sqlite:///{tmp_path}/store.db", every_s=0.01).start()
    try:
        deadline = time.monotonic() + 30
        while len(starts) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
    assert len(starts) >= 3
    for (began, ended), (after, _) in zip(starts, starts[1:]):
        assert after - ended >= 3 * (ended - began) * 0.99, starts  # the wait, not every_s (0.01 s)
