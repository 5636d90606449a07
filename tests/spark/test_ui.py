"""Spark's UI and progress events show headrace: jobs described by computation, batch and
records (read back through the UI's REST API), and headrace's watermark, late and dead-letter
counts in the observed metrics of each computation's progress query, in both modes."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any, Iterator

from headrace import Computation, Topology, injectors, key_by, run, watermarks
from headrace.model import END_OF_TIME
from headrace.spark.progress import METRICS
from headrace.store import open_store


class Counter(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value["n"] == 77:
            raise ValueError("cannot handle 77")
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"user": ctx.key, "n": ctx.state})


LATE, BAD = 5, 3  # records far behind the watermark; records dead-lettered (2 without a key, 1 that raises)


def build(store_url: str) -> Topology:
    def events() -> Iterator[dict[str, Any]]:
        yield from ({"user": f"u{i % 5}", "n": i, "ts": 1_000 + i} for i in range(150))
        yield {"n": -1, "ts": 1_150}  # no "user": the key extractor raises
        deadline = time.time() + 120
        while time.time() < deadline and (
                (mark := watermarks(store_url).get("Counter")) is None or mark.input_watermark < 1_100):
            time.sleep(0.05)
        yield from ({"user": "u0", "n": 1_000 + i, "ts": 1_000 + i} for i in range(LATE))  # late on purpose
        yield {"n": -2, "ts": 1_160}
        yield from ({"user": f"u{i % 5}", "n": i, "ts": 1_000 + i} for i in range(150, 300))

    t = Topology("ui")
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=30, max_delay_ms=0))
    t.add(Counter, inputs={"events": key_by("user")}, outputs=["counts"], shards=2, on_error="dead_letter")
    return t


def jobs(ui: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=10) as f:
        app = json.load(f)[0]["id"]
    with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/jobs", timeout=10) as f:
        return json.load(f)  # type: ignore[no-any-return]


def progress_listener(seen: list[tuple[str, dict[str, Any]]]) -> Any:
    """A StreamingQueryListener that appends (query name/observation, observed metrics) of every
    progress event to ``seen``."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            for name, metrics in event.progress.observedMetrics.items():
                seen.append((f"{event.progress.name}/{name}", metrics.asDict()))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return Progress()


def test_the_ui_lists_jobs_described_by_computation_and_a_listener_sees_watermark_late_and_dead_letters(
        spark: Any, store_url: str, mode: str) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []  # (query name, observed metrics) of every progress event

    def shown() -> list[dict[str, Any]]:
        return [m for name, m in list(seen) if name == "headrace-Counter/headrace"]

    listener = progress_listener(seen)
    spark.streams.addListener(listener)
    try:
        result = run(build(store_url), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode,
                     progress_queries=True)
        counters = open_store(store_url).counters("Counter")
        final = {"watermark": END_OF_TIME, "records": counters["records"], "late_dropped": counters["late_dropped"],
                 "dead_letters": counters["dead_lettered"]}
        # the run returns once a progress event carries the final numbers, but listeners hear of it
        # asynchronously, later still under load: wait for it, generously
        deadline = time.time() + 120
        while time.time() < deadline and not any(all(m[k] == v for k, v in final.items()) for m in shown()):
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    assert (counters["late_dropped"], counters["dead_lettered"]) == (LATE, BAD)
    events = shown()
    assert events, f"no progress event of headrace-Counter; seen: {seen}"
    assert all(set(m) == set(METRICS) for m in events), events
    for metric in ("watermark", "output_watermark", "records", "late_dropped", "dead_letters"):
        values = [m[metric] for m in events]
        assert values == sorted(values), f"{metric} went back: {events}"
    last = events[-1]
    assert {k: last[k] for k in final} == final, f"the last event is not the store's final numbers: {events}"
    assert last["watermark"] == watermarks(store_url)["Counter"].input_watermark
    assert last["watermark_lag_ms"] == 0 and last["late_delivered"] == 0

    assert result.ui_url is not None and result.ui_url.startswith("http://")
    described = [j.get("description", "") for j in jobs(result.ui_url)]
    if mode == "microbatch":
        batches = [d for d in described if d.startswith("headrace Counter: batch ")]
        assert batches and all(d.endswith(" records") for d in batches), described[:10]
        assert sum(int(d.split(", ")[1].split()[0]) for d in set(batches)) >= 300  # every record in some batch
        read = [m for name, m in list(seen) if name == "headrace-Counter-batches/headrace_batch"]
        assert sum(m["records"] for m in read) >= 300 + LATE + 2 and sum(m["rejected"] for m in read) >= 2, read
    else:
        assert any(d.startswith("headrace ui: ") and d.endswith("continuous workers running Counter") for d in described), \
            described[:10]


def test_a_run_stopped_while_its_input_goes_on_ends_with_an_event_of_the_numbers_it_stopped_at(
        spark: Any, store_url: str, mode: str) -> None:
    """Unbounded input, stopped by the caller (as Ctrl-C does): the computations stop first, and
    the progress query posts the store's final numbers before it stops too."""
    from headrace.spark.continuous import ContinuousRunner
    from headrace.spark.runner import SparkRunner

    def endless() -> Iterator[dict[str, Any]]:
        i = 0
        while True:
            yield {"user": f"u{i % 5}", "n": 1_000 + i, "ts": 1_000 + i}  # never the 77 Counter refuses
            i += 1
            if i % 20 == 0:
                time.sleep(0.02)

    t = Topology("ui_unbounded")
    t.inject("events", injectors.records(endless, timestamp="ts", batch_size=20, max_delay_ms=0))
    t.add(Counter, inputs={"events": key_by("user")}, outputs=["counts"], shards=2)
    seen: list[tuple[str, dict[str, Any]]] = []
    listener = progress_listener(seen)
    spark.streams.addListener(listener)
    try:
        runner = (ContinuousRunner(t, store_url, spark=spark, progress=None, progress_queries=True) if mode == "continuous"
                  else SparkRunner(t, store_url, spark=spark, progress=None, trigger_ms=100, progress_queries=True))
        runner.start()
        try:
            store = open_store(store_url)
            deadline = time.time() + 120
            while time.time() < deadline and (store.counters("Counter").get("records", 0) < 500
                                              or "Counter" not in watermarks(store_url)):
                runner.check()
                time.sleep(0.1)
        finally:
            runner.stop()
        final = {"records": store.counters("Counter")["records"],
                 "watermark": watermarks(store_url)["Counter"].input_watermark}
        store.close()
        # Spark's listener bus hands events on after the query has them: an earlier event with the
        # final count (its watermark journaled a moment later) may be the newest the listener has yet
        deadline = time.time() + 60
        while time.time() < deadline and not any(
                {k: m[k] for k in final} == final for name, m in list(seen) if name == "headrace-Counter/headrace"):
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    events = [m for name, m in list(seen) if name == "headrace-Counter/headrace"]
    assert final["records"] >= 500 and final["watermark"] < END_OF_TIME
    assert events and {k: events[-1][k] for k in final} == final, f"the last event is not where the run stopped: {events}"
