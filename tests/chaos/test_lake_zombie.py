"""A zombie Delta sink writer: a driver SIGSTOPped (with its Spark JVM and workers) inside the
sink's write, after it passed its fence check and read the table; a second driver takes the sink
(and, in continuous mode, the lapsed leases of its intervals) over and runs to the end; then the
first is resumed. It commits no Delta version: its commit was made against the snapshot it read,
and the second driver committed the same producers' batches since (Delta's conflict check on
the application transactions), so the table holds every record once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from headrace.lake.delta import WRITER_KEY
from headrace.store import open_store

from ..ci import long_only
from .test_sink_chaos import SCRIPT, check_exactly_once

N = 900
SINK = "stamped-delta"


def driver(store: str, mode: str, root: str, log: Path, marks: Path | None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("HEADRACE_FAILPOINTS", None)
    if marks is not None:
        env["HEADRACE_FAILPOINTS"] = f"lake_commit=sleep:20000:{marks}"
    return subprocess.Popen([sys.executable, str(SCRIPT), store, str(N), mode, "delta", root], env=env,
                            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, start_new_session=True)


def versions_by(root: str, writer: str) -> int:
    return sum(1 for commit in DeltaTable(root).history() if commit.get(WRITER_KEY) == writer)


@pytest.mark.parametrize("mode", ["continuous", "microbatch"])
def test_a_zombie_delta_writer_commits_no_version(spark: Any, tmp_path: Path, mode: str) -> None:
    if mode == "microbatch":
        long_only("the micro-batch zombie", covered_by="the continuous-mode zombie (leases lapse too)")
    store, root, marks = f"sqlite:///{tmp_path}/store.db", str(tmp_path / "delta"), tmp_path / "marks"
    marks.mkdir()
    zombie = driver(store, mode, root, tmp_path / "zombie.log", marks)
    second: subprocess.Popen[str] | None = None
    try:
        deadline = time.time() + 240
        while not any(marks.iterdir()):
            assert zombie.poll() is None, (tmp_path / "zombie.log").read_text()[-3000:]
            assert time.time() < deadline, "the first driver never reached its sink's commit"
            time.sleep(0.01)
        os.killpg(zombie.pid, signal.SIGSTOP)
        handle = open_store(store)
        zombie_writer = f"{SINK}:{handle.sink_writer(SINK)}"
        handle.close()
        before = versions_by(root, zombie_writer)

        second = driver(store, mode, root, tmp_path / "second.log", None)
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 0 and "drained" in out, (tmp_path / "second.log").read_text()[-3000:]

        os.killpg(zombie.pid, signal.SIGCONT)
        zombie.communicate(timeout=120)
    finally:
        for process in (zombie, second):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    log = (tmp_path / "zombie.log").read_text()
    assert zombie.returncode != 0, "the zombie ended as if nothing happened"
    assert f"The Delta sink '{SINK}' lost its commit to another writer" in log, log[-3000:]
    assert versions_by(root, zombie_writer) == before, "the zombie committed a Delta version after it resumed"
    table = DeltaTable(root)
    check_exactly_once([(r["n"], r["id"]) for r in table.to_pyarrow_table(columns=["n", "id"]).to_pylist()], N)
