"""Rescaling across restarts (docs/architecture.md §3.6): the three-stage oracle pipeline at 4
shards per stage, stopped while watermark timers are pending; a driver SIGKILLed inside the change
to 7; 7 shards; then 2 to the end. The outputs equal the oracle and no state is left over.

The short version runs each life on the session's SparkSession; the slow one runs each as a
driver process of its own and SIGKILLs drivers mid-run after each change too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from headrace import run

from .conftest import start_runner
from .pipelines import searches
from .rescaling import (STAGES, check_against_the_oracle, counted_once, journaled, kill_inside_the_change,
                        run_then_quiesce, pending_watermark_timers,
                        rescaled, shard_counts)

SCRIPT = Path(__file__).with_name("rescaling.py")


def test_rescaling_4_to_7_to_2_across_restarts_equals_the_oracle(spark: Any, store_url: str, mode: str,
                                                                  tmp_path: Path) -> None:
    events = searches(1_000, seed=9)
    taken = run_then_quiesce(start_runner(rescaled(events, 4, rate=100), store_url, spark, mode), store_url, 100)
    assert shard_counts(store_url) == dict.fromkeys(STAGES, 4)
    assert pending_watermark_timers(store_url) > 0
    counted_once(store_url, taken)

    kill_inside_the_change(store_url, 7, tmp_path / "marks")
    taken += run_then_quiesce(start_runner(rescaled(events, 7, rate=100), store_url, spark, mode), store_url, 100)
    assert shard_counts(store_url) == dict.fromkeys(STAGES, 7)
    assert pending_watermark_timers(store_url) > 0
    counted_once(store_url, taken)

    run(rescaled(events, 2, rate=None), store=store_url, spark=spark, progress=None, timeout_s=120, mode=mode)
    assert shard_counts(store_url) == dict.fromkeys(STAGES, 2)
    check_against_the_oracle(store_url, events)


def driver(url: str, shards: int, mode: str, log: Path, *stop_after: int,
           rate: int = 100) -> subprocess.Popen[str]:
    """A driver process of the pipeline (tests/spark/rescaling.py); ``rate`` 0: as fast as it goes."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen([sys.executable, str(SCRIPT), url, str(shards), mode, str(N_SLOW), str(rate),
                             *map(str, stop_after)], env=env, stdout=subprocess.PIPE, stderr=log.open("a"),
                            text=True)


def finish(proc: subprocess.Popen[str], log: Path, timeout_s: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, log.read_text()[-3_000:]
    return out


N_SLOW = 6_000


@pytest.mark.slow
def test_rescaling_with_driver_processes_sigkilled_around_each_change(each_store: str, mode: str,
                                                                      tmp_path: Path) -> None:
    """Each life a driver process: 4 shards, stopped cleanly with timers pending; a driver killed
    inside the change to 7; a 7-shard driver SIGKILLed mid-run once it has committed; 7 again,
    stopped cleanly (a micro-batch the kill cut short completes under the layout that began it);
    a kill inside the change to 2; 2 to the end."""
    url, log = each_store, tmp_path / "drivers.log"
    taken = int(finish(driver(url, 4, mode, log, 100), log).split()[-1])
    assert pending_watermark_timers(url) > 0
    counted_once(url, taken)

    kill_inside_the_change(url, 7, tmp_path / "marks-7")
    before = journaled(url)
    proc = driver(url, 7, mode, log)
    deadline = time.monotonic() + 120
    while journaled(url) < before + 6:  # the new layout has committed: kill the driver mid-run
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3_000:]
        time.sleep(0.05)
    assert shard_counts(url) == dict.fromkeys(STAGES, 7)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()  # type: ignore[union-attr]
    finish(driver(url, 7, mode, log, 100), log)
    assert pending_watermark_timers(url) > 0

    kill_inside_the_change(url, 2, tmp_path / "marks-2")
    assert "drained" in finish(driver(url, 2, mode, log, rate=0), log)
    assert shard_counts(url) == dict.fromkeys(STAGES, 2)
    check_against_the_oracle(url, searches(N_SLOW, seed=9))
