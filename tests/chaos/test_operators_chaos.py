"""The operators under SIGKILL: the driver of the topology of every operator case
(tests/operator_topology.py) is killed in the middle of its run, the whole process group at once,
and started again on the same store; what every operator produced equals its DuckDB oracle, each
window, pair, lookup and kept record once (a window emitted again counts with its last emission,
as the cases' rule says, and a repeated pair or lookup would show as a row too many).

CI kills one continuous run once; `scripts/test --long tests/chaos` kills each mode three times."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrace.model import END_OF_TIME
from headrace.store import open_store

from ..operator_topology import check

SCRIPT = Path(__file__).resolve().parents[1] / "operator_topology.py"


def progress(store_url: str) -> tuple[int, bool]:
    """Batches the injectors have published so far (about 135 in all), and whether every operator
    has drained."""
    store = open_store(store_url)
    try:
        heads = store.journal_heads()
    finally:
        store.close()
    ops = [b for b in heads if not b.producer.startswith("inject:")]
    published = sum(b.batch for b in heads if b.producer.startswith("inject:"))
    return published, bool(ops) and all(b.output_watermark == END_OF_TIME for b in ops)


def kill_and_resume(tmp: Path, mode: str, kills: int, seed: int) -> str:
    store_url = f"sqlite:///{tmp}/store.db"
    log = open(tmp / "drivers.log", "a")
    rng = random.Random(seed)

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(SCRIPT), store_url, mode, str(seed), "60"],
                                env={**os.environ, "PYSPARK_PYTHON": sys.executable}, stdout=subprocess.PIPE,
                                stderr=log, text=True, start_new_session=True)

    driver, done = start(), 0
    deadline = time.time() + 600
    while done < kills:
        assert time.time() < deadline, f"only {done} kills in time"
        assert driver.poll() is None, (tmp / "drivers.log").read_text()[-3000:]
        batches, drained = progress(store_url) if (tmp / "store.db").exists() else (0, False)
        assert not drained, f"drained after {done} kills: too fast to kill in the middle"
        if batches >= 10 + 30 * done + rng.randrange(15):  # input published, with more to come
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            done += 1
            driver = start()
        time.sleep(0.1)
    out, _ = driver.communicate(timeout=max(30.0, deadline - time.time()))
    assert driver.returncode == 0 and "drained" in out, (tmp / "drivers.log").read_text()[-3000:]
    return store_url


def test_every_operator_equals_its_oracle_after_a_driver_kill(tmp_path: Path) -> None:
    check(kill_and_resume(tmp_path, "continuous", kills=1, seed=3), seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["microbatch", "continuous"])
def test_every_operator_equals_its_oracle_after_three_driver_kills(tmp_path: Path, mode: str) -> None:
    check(kill_and_resume(tmp_path, mode, kills=3, seed=4), seed=4)
