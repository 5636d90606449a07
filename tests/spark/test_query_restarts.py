"""A micro-batch query that fails under headrace (its Python streaming source's runner killed)
starts again from its checkpoint and the run goes on, as the continuous workers' job is
resubmitted; a query that headrace failed stays failed (tests/spark/test_poison.py)."""

from __future__ import annotations

import io
import os
import signal
import time
from collections import defaultdict
from typing import Any

from headrace import Computation, Topology, injectors, key_by, read
from headrace.spark.runner import MicroBatchRunner

from ..chaos.test_chaos import cmdline, descendants
from .test_idle import Gate

RUNNER = "python_streaming_source_runner"


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"user": ctx.key, "n": ctx.state})


def wait_for(runner: Any, what: str, done: Any, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while not done():
        runner.check()
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_query_whose_source_runner_was_killed_starts_again_from_its_checkpoint(spark: Any, store_url: str) -> None:
    users = [f"u{i}" for i in range(5)]
    gate = Gate([{"user": users[i % 5], "ts": 1_000 + i} for i in range(50)],
                [{"user": users[i % 5], "ts": 2_000 + i} for i in range(50)])
    t = Topology("restarts")
    t.inject("events", injectors.records(gate, timestamp="ts", batch_size=25))
    t.add(Count, inputs={"events": key_by("user")}, outputs=["counts"], shards=2)
    said = io.StringIO()
    runner = MicroBatchRunner(t, store_url, spark=spark, trigger_ms=100, progress=said, progress_every_s=3600).start()
    try:
        wait_for(runner, "the first records", lambda: len(list(read("counts", store_url))) == 50)
        runners = [p for p in descendants(os.getpid()) if RUNNER in cmdline(p)]
        assert runners, [cmdline(p) for p in descendants(os.getpid())]
        for pid in runners:
            os.kill(pid, signal.SIGKILL)
        wait_for(runner, "the query to start again", lambda: runner.resubmissions >= 1)
        gate.opened.set()
        wait_for(runner, "the run to drain", runner.drained)
    finally:
        runner.stop()
    counts: defaultdict[str, list[int]] = defaultdict(list)
    for r in read("counts", store_url):
        counts[r.value["user"]].append(r.value["n"])
    assert {user: sorted(ns) for user, ns in counts.items()} == {user: list(range(1, 21)) for user in users}
    assert "headrace: the query of computation 'Count' failed and starts again from its checkpoint" in said.getvalue()
