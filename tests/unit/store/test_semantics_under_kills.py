"""State and output semantics (the Facebook paper's Figure 8) under real crashes, on SQLite and on
PostgreSQL: a counter that produces one record per input is SIGKILLed at the paper's failure
points (before and after its offset and state are saved, before and after its output goes out),
resumed each time, and finally run to the end. Against the oracle (every input once in the state,
every input's production once in the stream):

- exactly-once state never loses nor doubles an input in the state;
- at-least-once never loses (state or output), and may double;
- at-most-once never doubles (state or output), and may lose;
- exactly-once output never loses nor doubles a production.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from headrace.model import SEMANTICS, ComputationOptions
from headrace.store import open_store

from . import semantics_child as child

CHILD = Path(child.__file__)


def failure_points(state: str, output: str) -> list[tuple[str, int]]:
    """(commit step, occurrence in the run) for each kill, one run after another. A shard batch
    with at-most-once state commits twice (its offset, then its state), so ``begin`` and
    ``after_commit`` are taken at an odd and an even occurrence: before and after each save."""
    points = [("begin", 3), ("after_commit", 3), ("begin", 4), ("after_commit", 4)]
    if output == "at_least_once":
        points += [("weak_productions", 2), ("begin", 2)]  # before and after the output, sent first
    if output == "at_most_once":
        points += [("output", 2), ("after_output", 2)]  # before and after the output, sent last
    return points


def run_child(url: str, state: str, output: str, *kill: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), url, state, output, *kill], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("state, output", sorted(SEMANTICS))
def test_each_semantics_keeps_its_promise_when_killed_at_every_failure_point(store_url: str, state: str,
                                                                              output: str) -> None:
    for step, occurrence in failure_points(state, output):
        done = run_child(store_url, state, output, step, str(occurrence))
        assert done.returncode == -9, f"no kill at {step} #{occurrence}: {done.returncode} {done.stderr[-2000:]}"
    done = run_child(store_url, state, output)
    assert (done.returncode, done.stdout.split()) == (0, ["done"]), done.stderr[-2000:]

    store = open_store(store_url)
    try:
        inputs = {f"in-{b}-{i}" for b in range(1, child.BATCHES + 1) for i in range(child.RECORDS)}
        produced = Counter(r.value for _, r in store.read_segments(child.STREAM, child.NAME, 0, 10**9))
        codec = ComputationOptions().codec
        counted = {k: codec.decode(raw) if (raw := store.state(child.NAME, k)) is not None else 0
                   for k in map(child.key_of, range(child.KEYS))}
    finally:
        store.close()
    per_key = child.BATCHES * child.RECORDS // child.KEYS
    lost = sorted(inputs - set(produced))
    doubled = sorted(i for i, n in produced.items() if n > 1)
    state_lost = {k: per_key - n for k, n in counted.items() if n < per_key}
    state_doubled = {k: n - per_key for k, n in counted.items() if n > per_key}
    assert set(produced) <= inputs

    if state == "exactly_once":
        assert (state_lost, state_doubled) == ({}, {}), "exactly-once state lost or doubled an input"
    if state == "at_least_once":
        assert state_lost == {}, "at-least-once state lost an input"
    if state == "at_most_once":
        assert state_doubled == {}, "at-most-once state counted an input twice"
        assert state_lost, "the kills after the offset was saved lose their batch's input"
    if output == "exactly_once":
        assert (lost, doubled) == ([], []), "exactly-once output lost or doubled a production"
    if output == "at_least_once":
        assert lost == [], "at-least-once output lost a production"
    if output == "at_most_once":
        assert doubled == [], "at-most-once output sent a production twice"
        assert lost, "the kills between the state commit and the output lose that output"
