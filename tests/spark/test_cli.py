from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from headrace import cli
from headrace.spark.runner import SparkRunner

from .pipelines import three_stage, searches

TOPOLOGY_MODULE = '''
from headrace import Computation, Topology, injectors, key_by

class Count(Computation):
    def process_record(self, ctx, record):
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("end", 10_000)
    def process_timer(self, ctx, timer):
        ctx.produce("counts", {"word": ctx.key, "n": ctx.state})

topology = Topology("cli_demo")
topology.inject("words", injectors.records([{"w": w, "ts": i} for i, w in enumerate("abcabca")], timestamp="ts"))
topology.add(Count, inputs={"words": key_by("w")}, outputs=["counts"])
'''


def test_cli_runs_a_topology_then_shows_watermarks_and_reads_a_stream(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cli_topology_mod.py").write_text(TOPOLOGY_MODULE)
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path}/cli.db"
    assert cli.main(["run", "cli_topology_mod:topology", "--store", store, "--timeout", "240"]) == 0
    shown = capsys.readouterr()
    assert re.search(r"drained in [\d.]+ s: Count: \d+ batches, 7 records", shown.out)
    assert re.search(r"headrace: dashboard at http://127\.0\.0\.1:\d+/", shown.err)  # served while it ran

    assert cli.main(["watermarks", "--store", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Count") and line.endswith("output end-of-time") for line in lines)
    assert any(line.startswith("inject:words") for line in lines)

    assert cli.main(["read", "counts", "--store", store]) == 0
    counts = sorted((json.loads(line)["value"]["word"], json.loads(line)["value"]["n"])
                    for line in capsys.readouterr().out.splitlines())
    assert counts == [("a", 3), ("b", 2), ("c", 2)]
    assert cli.main(["read", "counts", "--store", store, "--limit", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_cli_refuses_a_target_that_is_not_module_colon_attribute(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "no_colon_here"]) == 2
    assert capsys.readouterr().err.strip() == (
        "headrace: Name the topology as module:attribute (got 'no_colon_here'). "
        "Hint: e.g. headrace run examples.zeitgeist.job:topology")


def test_progress_is_shown_while_it_runs(spark: Any, store_url: str) -> None:
    events = searches(600, seed=9)
    topology = three_stage(events, name="progress", batch_size=50, rate=300)
    out = io.StringIO()
    runner = SparkRunner(topology, store_url, spark=spark, progress=out, progress_every_s=0.5, trigger_ms=100).start()
    try:
        runner.wait(timeout_s=240)
    finally:
        runner.stop()
    ui, *lines = out.getvalue().splitlines()
    assert re.fullmatch(r"headrace: Spark UI at http://\S+:\d+", ui), ui  # first, where to watch it
    assert len(lines) >= 2
    assert all("inject:searches: wm=" in line and "WindowCounter: wm=" in line for line in lines)
