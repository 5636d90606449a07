"""Spark's UI and progress events show headrace: jobs described by computation, batch and
records (read back through the UI's REST API), and headrace's watermark in the observed metrics
of each computation's streaming progress."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from headrace import Computation, Topology, injectors, key_by, run, watermarks
from headrace.model import END_OF_TIME


class Counter(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"user": ctx.key, "n": ctx.state})


def build() -> Topology:
    t = Topology("ui")
    data = [{"user": f"u{i % 5}", "ts": 1_000 + i} for i in range(300)]
    t.inject("events", injectors.records(data, timestamp="ts", batch_size=60))
    t.add(Counter, inputs={"events": key_by("user")}, outputs=["counts"], shards=2)
    return t


def jobs(ui: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=10) as f:
        app = json.load(f)[0]["id"]
    with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/jobs", timeout=10) as f:
        return json.load(f)  # type: ignore[no-any-return]


def test_the_ui_lists_jobs_described_by_computation_and_a_listener_sees_the_watermark(
        spark: Any, store_url: str, mode: str) -> None:
    from pyspark.sql.streaming import StreamingQueryListener

    seen: list[tuple[str, Any]] = []

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            metrics = event.progress.observedMetrics.get("headrace")
            if metrics is not None:
                seen.append((event.progress.name, metrics))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Progress()
    spark.streams.addListener(listener)
    try:
        result = run(build(), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    finally:
        # progress events reach Python listeners asynchronously, well after the run under load
        deadline = time.time() + (20 if mode == "microbatch" else 1)
        while time.time() < deadline and not any(
                name == "headrace-Counter" and m["watermark"] == END_OF_TIME for name, m in seen):
            time.sleep(0.2)
        spark.streams.removeListener(listener)
    assert result.ui_url is not None and result.ui_url.startswith("http://")
    described = [j.get("description", "") for j in jobs(result.ui_url)]
    if mode == "microbatch":
        batches = [d for d in described if d.startswith("headrace Counter: batch ")]
        assert batches and all(d.endswith(" records") for d in batches), described[:10]
        assert sum(int(d.split(", ")[1].split()[0]) for d in set(batches)) >= 300  # every record in some batch
        marks = [m["watermark"] for name, m in seen if name == "headrace-Counter" and m["watermark"] is not None]
        assert marks and marks == sorted(marks) and marks[-1] == END_OF_TIME == watermarks(store_url)["Counter"].input_watermark, \
            (result.stats["Counter"].batches, seen)
        assert sum(m["records"] for name, m in seen if name == "headrace-Counter") >= 300
    else:
        assert any(d.startswith("headrace ui: ") and d.endswith("continuous workers running Counter") for d in described), \
            described[:10]
