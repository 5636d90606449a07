"""Watching a running pipeline from its store (docs/monitoring.md): ``headrace status --json`` as a
real CLI process, ``headrace state``/``timers`` against the harness. One continuous-mode run of the
three-stage pipeline (plus a keyed tally and a stage that can be slowed on purpose) serves every
test of this module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

import headrace
from headrace import Computation, injectors, key_by
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME
from headrace.spark.continuous import ContinuousRunner
from headrace.store import open_store
from headrace.testing import Harness

from .pipelines import searches, three_stage

THREE_STAGES = ("WindowCounter", "BucketTotals", "BusiestBucketPerTenSeconds")
STAGES = (*THREE_STAGES, "QueryTally")


class QueryTally(Computation):
    """Per query: how many searches and the first and last timestamp; two far-away wall timers.
    Sleeps 10 ms per record while the file named by the record's ``hold`` exists."""

    def process_record(self, ctx: Any, record: Any) -> None:
        if os.path.exists(record.value["hold"]):
            time.sleep(0.01)
        tally = ctx.state or {"n": 0, "first": record.timestamp, "last": record.timestamp}
        tally = {"n": tally["n"] + 1, "first": min(tally["first"], record.timestamp),
                 "last": max(tally["last"], record.timestamp)}
        ctx.state = tally
        ctx.set_timer("expire", tally["last"] + 10**12, domain="wall")
        ctx.set_timer("anniversary", tally["first"] + 2 * 10**12, domain="wall")


class Slow(Computation):
    """Sleeps a quarter second per record while the file its records name exists."""

    def process_record(self, ctx: Any, record: Any) -> None:
        if os.path.exists(record.value["flag"]):
            time.sleep(0.25)
        ctx.state = record.value["i"]


@dataclass
class Run:
    url: str
    runner: ContinuousRunner
    events: list[dict[str, Any]]
    flag: Path
    hold: Path
    seen: list[dict[str, Any]] = field(default_factory=list)  # status reports taken by test_status_*


@pytest.fixture(scope="module")
def run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    folder = tmp_path_factory.mktemp("monitor")
    url = f"sqlite:///{folder}/store.db"
    flag, hold = folder / "slow", folder / "hold"
    hold.touch()  # QueryTally is slow until the first test has seen its backlog
    events = [{**e, "hold": str(hold)} for e in searches(1500, seed=5)]
    topology = three_stage(events, batch_size=50, rate=500, name="watched")
    topology.add(QueryTally, inputs={"searches": key_by("query")}, codec="json", shards=2)
    topology.inject("ticks", injectors.generator(lambda i: {"i": i, "flag": str(flag)}, rate=20, batch_size=2))
    topology.add(Slow, inputs={"ticks": key_by(lambda v: "all")}, shards=1, alert_lag_ms=3_000)
    # a long lease: the slowed worker blocks in user code for seconds and must keep its intervals
    runner = ContinuousRunner(topology, url, spark=spark, lease_ms=30_000, metrics_port=0).start()
    try:
        yield Run(url, runner, events, flag, hold)
    finally:
        runner.stop()


def cli(*args: str) -> str:
    """Run ``headrace ARGS`` as a process of its own, as an operator on another machine would."""
    done = subprocess.run([sys.executable, "-m", "headrace.cli", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def poll(run: Run, condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        run.runner.check()
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s} s for {what}")
        time.sleep(0.1)


def journaled(url: str, producer: str) -> list[tuple[int, int]]:
    store = open_store(url)
    try:
        return [(b.input_watermark, b.output_watermark) for b in store.batches(producer)]
    finally:
        store.close()


def test_status_json_watermarks_match_the_journal_and_the_backlog_drains_to_zero(run: Run) -> None:
    def drained() -> bool:
        report = json.loads(cli("status", "--json", "--store", run.url))
        run.seen.append(report)
        stages = report["stages"]
        if stages["QueryTally"]["backlog_records"] > 0 and run.hold.exists():
            run.hold.unlink()  # its backlog was seen: let it catch up
        for name in (*STAGES, "inject:searches"):  # what status says is a row of the journal
            rows = journaled(run.url, name)
            mark = (stages[name]["input_watermark"], stages[name]["output_watermark"])
            assert mark in rows or (not rows and mark == (BEGINNING_OF_TIME, BEGINNING_OF_TIME)), (name, mark)
        # a quiet interval's position passes the producer's last batch in bulk, a moment after its
        # records are read: drained is both counts at zero (CI once saw batches at 1 with records at 0)
        return not run.hold.exists() and all(
            stages[n]["output_watermark"] == END_OF_TIME and stages[n]["backlog_records"] == 0
            and stages[n]["backlog_batches"] == 0 for n in STAGES)
    poll(run, drained, "the three stages to drain, seen through `headrace status --json`")

    last = run.seen[-1]
    assert last["topologies"][0]["name"] == "watched" and last["topologies"][0]["mode"] == "continuous"
    for name in STAGES:
        stage = last["stages"][name]
        assert (stage["input_watermark"], stage["output_watermark"]) == journaled(run.url, name)[-1]
        assert stage["backlog_batches"] == 0 and stage["producer_lag_ms"] == 0 and stage["watermark_lag_ms"] == 0
        assert stage["kind"] == "computation" and stage["last_error"] is None
        assert len(stage["owners"]) == stage["shards"] and all(o["live"] for o in stage["owners"])
    assert last["stages"]["WindowCounter"]["records"] == len(run.events)
    assert last["stages"]["WindowCounter"]["upstream"] == ["inject:searches"]
    assert last["stages"]["BucketTotals"]["inputs"] == ["window_counts"]
    assert last["stages"]["inject:searches"]["records"] == len(run.events)
    # QueryTally, held back, had a backlog; the three stages have one only while the workers start
    assert max(r["stages"]["QueryTally"]["backlog_records"] for r in run.seen) > 0
    print("largest backlogs seen:", {n: max(r["stages"][n]["backlog_records"] for r in run.seen) for n in STAGES})


def test_state_and_timers_of_a_key_match_the_harness_after_the_same_input(run: Run) -> None:
    run.hold.unlink(missing_ok=True)
    poll(run, lambda: json.loads(cli("status", "--json", "--store", run.url))["stages"]["QueryTally"][
        "output_watermark"] == END_OF_TIME, "QueryTally to drain")
    for key in ("q0", "q7"):
        harness = Harness(QueryTally, codec="json")
        for e in run.events:
            if e["query"] == key:
                harness.process(key, e, e["ts"])
        assert json.loads(cli("state", "QueryTally", key, "--store", run.url)) == harness.state(key)
        shown = [json.loads(line) for line in cli("timers", "QueryTally", key, "--store", run.url).splitlines()]
        assert shown == [t._asdict() for t in harness.timers(key)] and len(shown) == 2


def scrape(run: Run) -> dict[str, dict[tuple[str, ...], float]]:
    """``/metrics`` fetched over HTTP and parsed by prometheus-client's own parser: per sample name,
    the value of each label set."""
    url = f"http://127.0.0.1:{run.runner.watcher.metrics_port}/metrics"  # type: ignore[union-attr]
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_parse_and_their_watermark_gauges_move_forward(run: Run) -> None:
    def stage(name: str, kind: str) -> tuple[str, ...]:
        return (("kind", kind), ("stage", name))

    first = poll(run, lambda: (m := scrape(run)).get("headrace_output_watermark_seconds", {}).get(
        stage("Slow", "computation")) and m, "a first Slow watermark on /metrics")
    time.sleep(2.5)
    second = scrape(run)
    for name, kind in (("inject:ticks", "injector"), ("Slow", "computation")):
        for metric in ("headrace_input_watermark_seconds", "headrace_output_watermark_seconds"):
            assert second[metric][stage(name, kind)] > first[metric][stage(name, kind)], (metric, name)
    assert second["headrace_output_watermark_seconds"][stage("WindowCounter", "computation")] == float("inf")
    assert second["headrace_records_total"][stage("WindowCounter", "computation")] == len(run.events)
    assert second["headrace_backlog_records"][stage("WindowCounter", "computation")] == 0
    assert second["headrace_late_dropped_total"][stage("WindowCounter", "computation")] == 0
    assert second["headrace_records_per_second"][stage("inject:ticks", "injector")] > 0
    assert second["headrace_alert"][stage("Slow", "computation")] == 0
    assert {"headrace_watermark_lag_seconds", "headrace_dead_letters_total", "headrace_commit_interval_max_seconds",
            "headrace_commit_interval_mean_seconds", "headrace_producer_lag_seconds"} <= set(second)


def test_a_slowed_stage_raises_a_lag_alert_that_clears_once_it_catches_up(
        run: Run, caplog: pytest.LogCaptureFixture) -> None:
    def slow() -> dict[str, Any]:
        return headrace.status(run.url)["stages"]["Slow"]

    poll(run, lambda: (lag := slow()["watermark_lag_ms"]) is not None and lag < 3_000, "Slow to keep up at first")
    assert slow()["alert"] is None
    run.flag.touch()  # from now on Slow sleeps a quarter second per record, at 20 records a second
    try:
        raised = poll(run, lambda: (r := headrace.status(run.url))["stages"]["Slow"]["alert"] and r,
                      "the lag alert of Slow", timeout_s=30)
        shown = cli("status", "--store", run.url)
    finally:
        run.flag.unlink()
    alert = raised["stages"]["Slow"]["alert"]
    assert raised["alerts"] == [alert] and alert["stage"] == "Slow" and alert["threshold_ms"] == 3_000
    assert alert["lag_ms"] > 3_000
    assert "ALERT Slow: watermark" in shown and "(alert_lag_ms=3000)" in shown

    cleared = poll(run, lambda: (r := headrace.status(run.url))["stages"]["Slow"]["alert"] is None and r,
                   "the lag alert of Slow to clear", timeout_s=30)
    assert cleared["alerts"] == [] and cleared["stages"]["Slow"]["watermark_lag_ms"] <= 3_000
    store = open_store(run.url)
    try:
        kinds = [(e.kind, json.loads(e.detail)["threshold_ms"]) for e in store.events(kinds=("alert", "cleared"))
                 if e.name == "Slow"]
    finally:
        store.close()
    assert kinds == [("alert", 3_000), ("cleared", 3_000)]
    logged = [r.getMessage() for r in caplog.records if r.name == "headrace.monitor"]
    assert any(m.startswith("headrace alert: Slow's low watermark is") for m in logged)
    assert any(m.startswith("headrace alert cleared: Slow's low watermark is") for m in logged)

