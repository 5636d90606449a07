"""Continuous mode on a real Spark standalone cluster (a master and two workers started with
``spark-class``): the worker loops are tasks of one background job, in executor processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .standalone import standalone_cluster

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_continuous_workers_are_tasks_of_one_job_on_a_standalone_cluster(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/store.db"
    with standalone_cluster(workers=2, cores=1, logs=tmp_path) as cluster:
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("continuous_driver.py")), cluster.url,
                               store], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])

    assert report["slots"] == 2, "one worker per core of the cluster"
    rows = report["workers"]
    assert len(rows) == 2, rows
    assert sorted(r["partition"] for r in rows.values()) == [0, 1]
    assert all(isinstance(r["stage"], int) and r["attempt"] == 0 for r in rows.values()), rows
    assert len({r["stage"] for r in rows.values()}) == 1, "both loops are tasks of one stage"
    assert report["driver"]["pid"] not in {r["pid"] for r in rows.values()}
    assert len({r["pid"] for r in rows.values()}) == 2, "each loop runs in its own executor's Python worker"

    (job,) = report["jobs"]
    assert job["status"] == "RUNNING" and rows[next(iter(rows))]["stage"] in job["stages"], report
    assert report["active_tasks"][str(job["stages"][0])] == 2, report
    assert report["ended"][str(job["id"])] == "SUCCEEDED", "the loops returned when told to stop"
