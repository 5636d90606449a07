"""Keyed delivery (docs/architecture.md §3.7): each record of a stream is keyed once per
subscription, by its producer, however many workers read it; each worker reads only the records
of the intervals it owns. A callable key extractor counts its calls across every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from .keyed_driver import RECORDS

DRIVER = Path(__file__).with_name("keyed_driver.py")
ROOT = Path(__file__).parents[2]


def test_each_record_is_keyed_once_with_2_4_8_and_16_worker_slots(tmp_path: Path) -> None:
    slots = [2, 4, 8, 16]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, str(DRIVER), str(tmp_path), str(tmp_path), *map(str, slots)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["slots"] for r in runs] == slots
    oracle = Counter(str(i % 13) for i in range(RECORDS))
    for run in runs:
        calls = (tmp_path / str(run["slots"])).stat().st_size
        assert run["tagged"] == RECORDS and run["counts"] == dict(oracle), run["slots"]
        assert calls <= 1.1 * RECORDS, f"{run['slots']} slots: the extractor ran {calls} times for {RECORDS} records"
