"""The dashboard in a real headless Chromium, on a real continuous run on Spark (docs/monitoring.md).

The page must draw the journal's own watermarks as plot points, show every computation of the
topology in its graph and table, and look up a key's state and timers exactly as the store and
the harness hold them. A screenshot is saved (``HEADRACE_DASHBOARD_PNG=docs/dashboard.png`` also
writes it there: that is how README's screenshot is made).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import headrace
from headrace import Computation, Topology, injectors, key_by
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME
from headrace.monitor import state as stored_state, timers as stored_timers
from headrace.store import open_store
from headrace.testing import Harness

from ..chromium import Chromium, find_chromium
from .pipelines import BucketTotals, WindowCounter

SKIP_CHROMIUM = "HEADRACE_SKIP_CHROMIUM"
PROBE = "probe"
COMPUTATIONS = ["BucketTotals", "Tally", "WindowCounter"]


class Tally(Computation):
    """Per query: how many searches, and the newest; forgets the query an hour after its newest."""

    def process_record(self, ctx: Any, record: Any) -> None:
        tally = ctx.state or {"searches": 0, "newest": 0}
        tally = {"searches": tally["searches"] + 1, "newest": max(tally["newest"], record.timestamp)}
        ctx.state = tally
        ctx.set_timer("forget", tally["newest"] + 3_600_000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.state = None


def search(i: int) -> dict[str, str]:
    """The probe query only among the first records, so its state is final early in the run."""
    return {"query": PROBE if i < 40 and i % 4 == 0 else f"q{i % 7}"}


def topology() -> Topology:
    t = Topology("dashboard_demo")
    # wall-clock timestamps, about 20 s of them: the page is read while the run goes on
    t.inject("searches", injectors.generator(search, count=6_000, rate=300, batch_size=30, max_delay_ms=500))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    t.add(BucketTotals, inputs={"window_counts": key_by(lambda v: str(v["bucket"]))}, outputs=["bucket_totals"],
          shards=2)
    t.add(Tally, inputs={"searches": key_by("query")}, shards=2)
    return t


@pytest.fixture
def chromium() -> Any:
    binary = find_chromium()
    if binary is None:
        if os.environ.get(SKIP_CHROMIUM) == "1":
            pytest.skip(f"{SKIP_CHROMIUM}=1 and no Chromium was found")
        pytest.fail("The dashboard test needs a headless Chromium and none was found.\nHint: run scripts/ensure-chromium "
                    f"(apt-get install -y chromium; scripts/test does it when it may), or set {SKIP_CHROMIUM}=1 to skip "
                    "this test", pytrace=False)
    browser = Chromium(binary).start()
    yield browser
    browser.stop()


class Progress(io.StringIO):
    """The run's progress output, readable while the run writes it."""

    def wait_for(self, pattern: str, timeout_s: float, run: threading.Thread) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while not (found := re.search(pattern, self.getvalue())):
            assert run.is_alive() and time.monotonic() < deadline, f"no {pattern!r} in {self.getvalue()!r}"
            time.sleep(0.05)
        return found


def points(browser: Chromium, plot: str) -> dict[str, list[list[Any]]]:
    """What plotly drew in ``plot``: per trace, its (x as ms, y) points, and how many markers are in the DOM."""
    return browser.evaluate(f"""(() => {{
        const gd = document.getElementById({json.dumps(plot)});
        const out = {{}};
        (gd.data || []).forEach((t, i) => {{
            const markers = gd.querySelectorAll(`.scatterlayer .trace:nth-of-type(${{i + 1}}) path.point`).length;
            out[t.name] = {{xy: t.x.map((x, j) => [x.getTime(), t.y[j]]), markers}};
        }});
        return out;
    }})()""")


def test_the_dashboard_shows_a_running_pipeline_in_chromium(spark: Any, tmp_path: Path, chromium: Chromium) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    progress = Progress()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = headrace.run(topology(), store=url, master="local[2]", spark=spark,
                                             progress=progress, dashboard_port=0, timeout_s=120)
        except BaseException as exc:  # re-raised by the test thread
            outcome["error"] = exc

    runner = threading.Thread(target=run, name="dashboard-test-run")
    runner.start()
    try:
        address = progress.wait_for(r"dashboard at (http://\S+)", 60, runner).group(1)
        chromium.open(address)

        # the graph and the table name every computation of the topology
        shown = chromium.wait_for("""(() => {
            const names = [...document.querySelectorAll('svg.topology g.computation')].map(g => g.dataset.name);
            return names.length ? names.sort() : null; })()""", 20, "the topology graph was not drawn")
        assert shown == COMPUTATIONS
        assert chromium.evaluate("[...document.querySelectorAll('#stages tbody tr')].map(r => r.dataset.stage).sort()") \
            == ["BucketTotals", "Tally", "WindowCounter", "inject:searches"]
        assert chromium.evaluate("document.querySelectorAll('svg.topology g.stream').length") == 3

        # the plots draw real points: each computation's watermarks, lags and rates, as markers in the DOM
        def drawn() -> bool:
            plots = {p: points(chromium, p) for p in ("plot-watermark", "plot-lag", "plot-throughput", "plot-backlog")}
            return all(sum(y is not None for _, y in plots[p].get(c, {}).get("xy", [])) >= 3
                       and plots[p][c]["markers"] >= 3 for p in plots for c in COMPUTATIONS)

        deadline = time.monotonic() + 30
        while not drawn():
            assert runner.is_alive() and time.monotonic() < deadline, \
                f"the plots did not draw 3 points per computation: {points(chromium, 'plot-watermark')}, " \
                f"{points(chromium, 'plot-throughput')}; page errors {chromium.errors}"
            time.sleep(0.3)
        drawn_marks = points(chromium, "plot-watermark")
        store = open_store(url)
        try:
            for name in COMPUTATIONS:  # every plotted watermark is one the journal holds, at its time
                journal = {(b.completed_at, b.output_watermark if BEGINNING_OF_TIME < b.output_watermark < END_OF_TIME
                            else None) for b in store.batches(name)}
                assert {tuple(p) for p in drawn_marks[name]["xy"]} <= journal, name
        finally:
            store.close()

        # look up the probe key: the page shows what the store and the harness hold
        harness = Harness(Tally)
        probes = [r for r in headrace.read("searches", url) if r.value["query"] == PROBE]
        assert len(probes) == 10
        for r in probes:
            harness.process(PROBE, r.value, r.timestamp)
        expected = harness.state(PROBE)
        chromium.evaluate(f"""document.getElementById('lookup-computation').value = 'Tally';
            document.getElementById('lookup-key').value = {json.dumps(PROBE)};
            document.querySelector('#lookup button').click(); true""")
        looked_up = chromium.wait_for(f"""(() => {{
            const s = document.getElementById('lookup-state');
            if (!s || JSON.parse(s.textContent)?.searches !== {expected['searches']}) {{
                document.querySelector('#lookup button').click();  // the run may not have reached the key yet
                return null;
            }}
            return {{state: JSON.parse(s.textContent),
                     timers: [...document.querySelectorAll('#lookup-timers tr')].slice(1)
                               .map(r => [...r.cells].map(c => c.textContent))}}; }})()""",
                                       20, "the key lookup did not show the probe's state")
        assert looked_up["state"] == expected == stored_state(url, "Tally", PROBE)
        assert looked_up["timers"] == [[t.tag, t.domain, str(t.timestamp)] for t in harness.timers(PROBE)] \
            == [[t.tag, t.domain, str(t.timestamp)] for t in stored_timers(url, "Tally", PROBE)]

        shot = chromium.screenshot(tmp_path / "dashboard.png")
        assert shot.startswith(b"\x89PNG") and len(shot) > 20_000
        if os.environ.get("HEADRACE_DASHBOARD_PNG"):
            shutil.copy(tmp_path / "dashboard.png", os.environ["HEADRACE_DASHBOARD_PNG"])
        assert chromium.errors == []
        assert runner.is_alive(), "the run ended before the page was read: the checks above saw a live pipeline only if not"
    finally:
        runner.join(timeout=150)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].stats["Tally"].counters["records"] == 6_000
