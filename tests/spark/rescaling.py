"""The three-stage oracle pipeline with every stage at one shard count, and the checks the
rescaling tests share (tests/spark/test_rescale.py, tests/unit/test_rescale_harness.py).

As a script it is one driver life, which the slow test SIGKILLs:
``python rescaling.py STORE_URL SHARDS MODE N RATE [STOP_AFTER]`` (RATE 0: unlimited; with
STOP_AFTER, the life stops cleanly once it has published that many records).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from headrace import Topology, injectors, key_by, read
from headrace.store import open_store

sys.path.insert(0, str(Path(__file__).parents[2]))  # run as a script: the repository root, for tests.spark
from tests.spark.pipelines import BucketTotals, BusiestBucketPerTenSeconds, WindowCounter, oracle  # noqa: E402

STAGES = ("WindowCounter", "BucketTotals", "BusiestBucketPerTenSeconds")
REGISTER = """
import sys
from headrace.store import open_store
store = open_store(sys.argv[1])
for name in sys.argv[3:]:
    store.register(name, int(sys.argv[2]))
"""


def rescaled(events: list[dict[str, Any]], shards: int, rate: float | None, batch_size: int = 100) -> Topology:
    """The pipeline of tests/spark/pipelines.py ``three_stage``, every stage with ``shards``."""
    t = Topology("rescaled")
    t.inject("searches", injectors.records(events, timestamp="ts", batch_size=batch_size, rate=rate))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=shards)
    t.add(BucketTotals, inputs={"window_counts": key_by(lambda v: str(v["bucket"]))}, outputs=["bucket_totals"],
          shards=shards)
    t.add(BusiestBucketPerTenSeconds,
          inputs={"bucket_totals": key_by(lambda v: str(v["bucket"] - v["bucket"] % 10_000))},
          outputs=["busiest"], shards=shards)
    return t


def pending_watermark_timers(url: str) -> int:
    store = open_store(url)
    try:
        return sum(len(store.timers(stage, key)) for stage in STAGES for key in store.timer_keys(stage, 10_000))
    finally:
        store.close()


def shard_counts(url: str) -> dict[str, int]:
    store = open_store(url)
    try:
        return {stage: store.computations()[stage] for stage in STAGES}
    finally:
        store.close()


def kill_inside_the_change(url: str, shards: int, marks: Path) -> None:
    """A driver's first act, re-registering every stage with ``shards``, SIGKILLed inside the
    change's transaction (failpoint ``rescale``): the store must keep the old layout."""
    before = shard_counts(url)
    marks.mkdir(exist_ok=True)
    env = {**os.environ, "HEADRACE_FAILPOINTS": f"rescale=sleep:60000:{marks}"}
    child = subprocess.Popen([sys.executable, "-c", REGISTER, url, str(shards), *STAGES], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(marks.iterdir()):
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    child.communicate()
    assert shard_counts(url) == before


def counted_once(url: str, records: int) -> None:
    """Every record the first stage has taken is counted exactly once: in a key's pending state or
    in a window it emitted (a state lost or doubled by a move would break the sum)."""
    store = open_store(url)
    try:
        pending = sum(sum(pickle.loads(store.state(STAGES[0], key)).values())
                      for key in store.state_keys(STAGES[0], 1_000_000))
    finally:
        store.close()
    emitted = sum(r.value["count"] for r in read("window_counts", url))
    assert (pending, emitted, pending + emitted) == (pending, emitted, records)


def journaled(url: str) -> int:
    store = open_store(url)
    try:
        return sum(b.batch for b in (store.latest_batch(s) for s in STAGES) if b is not None)
    finally:
        store.close()


def first_stage_behind(url: str) -> int:
    """How many injected records the first stage has not counted yet."""
    store = open_store(url)
    try:
        injected = sum(store.segment_records("searches", p, 0, 1 << 62) for p in store.stream_producers("searches"))
        return injected - store.counters(STAGES[0]).get("records", 0)
    finally:
        store.close()


def run_then_quiesce(runner: Any, url: str, records: int, timeout_s: float = 60) -> int:
    """Let the injector publish ``records`` records, stop it, let the stages take what it sent (no
    micro-batch is cut short: a half-committed batch would refuse the change), then stop.
    Returns how many records this life published."""
    deadline = time.monotonic() + timeout_s
    while sum(i.published for i in runner.injectors.values()) < records:
        runner.check()
        assert time.monotonic() < deadline, runner.describe()
        time.sleep(0.05)
    for injector in runner.injectors.values():
        injector.stop()
    while first_stage_behind(url) > 0:
        runner.check()
        assert time.monotonic() < deadline, runner.describe()
        time.sleep(0.05)
    last, still_since = journaled(url), time.monotonic()
    while time.monotonic() - still_since < 1.5:
        time.sleep(0.1)
        if journaled(url) != last:
            last, still_since = journaled(url), time.monotonic()
    runner.stop()
    return sum(i.published for i in runner.injectors.values())


def check_against_the_oracle(url: str, events: list[dict[str, Any]]) -> None:
    """Outputs equal the oracle, each emitted once; every window closed, so no state or timer is
    left: a key's state lost or doubled in a move would have changed a count."""
    expected = oracle(events)
    windows = [r.value for r in read("window_counts", url)]
    totals = [r.value for r in read("bucket_totals", url)]
    busiest = [r.value for r in read("busiest", url)]
    assert {(v["query"], v["bucket"]): v["count"] for v in windows} == expected["window_counts"]
    assert len(windows) == len(expected["window_counts"])
    assert {v["bucket"]: {"searches": v["searches"], "queries": v["queries"]} for v in totals} == \
        expected["bucket_totals"]
    assert len(totals) == len(expected["bucket_totals"])
    assert {v["span"]: {"bucket": v["bucket"], "searches": v["searches"]} for v in busiest} == expected["busiest"]
    assert len(busiest) == len(expected["busiest"])
    store = open_store(url)
    try:
        assert {stage: store.state_keys(stage) for stage in STAGES} == {stage: [] for stage in STAGES}
        assert pending_watermark_timers(url) == 0
    finally:
        store.close()


if __name__ == "__main__":
    from headrace import run
    from headrace.spark.continuous import ContinuousRunner
    from headrace.spark.runner import SparkRunner
    from tests.spark.pipelines import searches

    url, shards, mode, n, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    topology = rescaled(searches(n, seed=9), shards, rate or None)
    if len(sys.argv) > 6:  # a life that stops (cleanly) once it has published this many records
        runner = (ContinuousRunner(topology, url, "local[2,100]", progress=None) if mode == "continuous" else
                  SparkRunner(topology, url, "local[2,100]", progress=None, trigger_ms=100))
        print("published", run_then_quiesce(runner.start(), url, int(sys.argv[6]), timeout_s=120), flush=True)
    else:
        timing = {"trigger_ms": 100} if mode == "microbatch" else {}
        run(topology, store=url, master="local[2,100]", progress=None, mode=mode, **timing)
        print("drained", flush=True)
