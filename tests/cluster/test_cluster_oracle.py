"""The three-stage oracle pipeline (tests/chaos) on a two-worker Spark standalone cluster with the
PostgreSQL store, run by ``headrace run``, in both execution modes: its Tagger imports, at run
time on the executors, a module of a user package that only the driver has (``headrace run`` ships
it); then the same with worker JVMs (with their executors) and drivers SIGKILLed mid-run.

CI runs the first in continuous mode; all of them: ``scripts/test --long tests/cluster``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from headrace.store import open_store

from ..chaos.test_chaos import Divergence, Monkey
from .standalone import Cluster, standalone_cluster

pytestmark = pytest.mark.spark
ROOT = Path(__file__).parents[2]

# A user's topology package, written outside the repository: the driver imports it from its working
# folder; the executors can import it only from what `headrace run` ships.
USER_PACKAGE = {
    "__init__.py": "",
    "job.py": '''
import os

from tests.chaos.chaos_topology import Tagger, build


class ShippedTagger(Tagger):
    def draw(self) -> float:
        from userjob.tags import draw  # at run time, on an executor

        return draw()


def topology():
    return build(int(os.environ["USERJOB_N"]), tagger=ShippedTagger)
''',
    "tags.py": '''
import random


def draw() -> float:
    return random.random()
''',
}


class ClusterMonkey(Monkey):
    """The chaos monkey of tests/chaos, with ``headrace run`` on a cluster as its driver, and a whole
    worker (its JVM, its executor, their Python workers) as what a "worker" kill takes."""

    def __init__(self, tmp: Path, store: str, n: int, mode: str, cluster: Cluster, seed: int = 3):
        super().__init__(tmp, store, "strong", n, seed, mode)
        self.survived = 0  # worker kills that the running driver outlived, its pipeline moving on
        self.cluster, self.user_dir = cluster, tmp / "user"
        self.driver_store = store  # the store's URL as the driver and its workers reach it
        self.user_dir.mkdir()
        (self.user_dir / "userjob").mkdir()
        for name, text in USER_PACKAGE.items():
            (self.user_dir / "userjob" / name).write_text(text.lstrip())

    def start_driver(self) -> subprocess.Popen[str]:
        if self.driver is not None and self.driver.returncode not in (None, 0, -signal.SIGKILL):
            log = (self.user_dir.parent / "drivers.log").read_text()
            raise AssertionError(f"a driver failed (exit {self.driver.returncode}): {log[-4000:]}")
        self.driver = subprocess.Popen(self.driver_command(), cwd=self.user_dir, env=self.driver_env(),
                                       stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        return self.driver

    def driver_command(self) -> list[str]:
        return [sys.executable, "-m", "headrace.cli", "run", "userjob.job:topology", "--master", self.cluster.url,
                "--store", self.driver_store, "--mode", self.mode, "--no-dashboard", "--no-ui"]

    def driver_env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), "USERJOB_N": str(self.n), "PYSPARK_PYTHON": sys.executable}

    def committed(self) -> int:
        store = open_store(self.store)
        try:
            return sum(head.batch for head in store.journal_heads())
        finally:
            store.close()

    def kill_worker(self) -> bool:
        """Kill a worker machine; replace it 2 s later. If the same driver is still running 10 s
        after the kill and its pipeline has committed more since, it survived the loss."""
        alive = [w for w in self.cluster.workers if w.poll() is None]
        driver, before = self.driver, self.committed()
        self.cluster.kill_worker(self.rng.choice(alive))
        self.kills["worker"] += 1
        time.sleep(2)
        self.cluster.start_worker()
        time.sleep(8)
        if driver is not None and driver.poll() is None and self.committed() > before and not self.drained():
            self.survived += 1
        return True


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with standalone_cluster(workers=2, cores=1, logs=tmp_path) as running:
        yield running


def finish(monkey: ClusterMonkey, kills: int, kinds: tuple[str, ...]) -> Divergence:
    try:
        monkey.run(kills, timeout_s=60 * 12, kinds=kinds)
    finally:
        if monkey.driver is not None and monkey.driver.poll() is None:
            os.killpg(monkey.driver.pid, signal.SIGKILL)
    log = (monkey.user_dir.parent / "drivers.log").read_text()
    assert "headrace: shipped " in log and "userjob.zip to the executors" in log, log[-3000:]
    return monkey.divergence()


@pytest.mark.parametrize("mode", [pytest.param("microbatch", marks=pytest.mark.slow), "continuous"])  # CI: one mode
def test_the_oracle_pipeline_runs_on_a_standalone_cluster_with_postgresql_and_a_shipped_user_package(
        tmp_path: Path, cluster: Cluster, postgres_server: Any, mode: str) -> None:
    monkey = ClusterMonkey(tmp_path, postgres_server.new_database(), 2_000, mode, cluster)
    assert finish(monkey, kills=0, kinds=()) == Divergence()
    assert monkey.kills == {}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["microbatch", "continuous"])
def test_worker_jvms_and_drivers_killed_on_a_standalone_cluster_leave_the_outputs_exact(
        tmp_path: Path, cluster: Cluster, postgres_server: Any, mode: str) -> None:
    monkey = ClusterMonkey(tmp_path, postgres_server.new_database(), 16_000, mode, cluster)
    found = finish(monkey, kills=4, kinds=("worker", "driver"))
    assert monkey.kills["worker"] >= 1 and monkey.kills["driver"] >= 2, monkey.kills
    assert monkey.survived >= 1, "no worker kill was outlived by a driver whose pipeline went on committing"
    assert found == Divergence()
