"""store/failpoints.py: ``HEADRACE_FAILPOINTS`` entries make a store sleep at a commit step, with a
marker file present exactly while it sleeps."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator

import pytest

from headrace.errors import OptionError
from headrace.store import failpoints
from headrace.store.failpoints import failpoint_from_env

STEPS = ("['weak_productions', 'begin', 'check_sequencer', 'state', 'timers', 'seen_ids', 'productions', "
         "'counters', 'version', 'before_commit', 'after_commit', 'output', 'after_output', 'stream_read', "
         "'rescale', 'lake_commit', 'sink_commit']")


class ControlledSleep:
    """Stands in for ``time.sleep`` in the failpoint: records each sleep and holds it until released,
    so a test can look at the marker file while the failpoint is provably asleep."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.asleep = threading.Event()
        self.release = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        self.asleep.set()
        if not self.release.wait(timeout=30):
            raise TimeoutError("the test never released the failpoint's sleep")


@pytest.fixture
def sleep(monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlledSleep]:
    controlled = ControlledSleep()
    monkeypatch.setattr(failpoints, "time", SimpleNamespace(sleep=controlled))  # this module's sleep only
    yield controlled
    controlled.release.set()


def made(spec: str) -> Callable[[str], None]:
    failpoint = failpoint_from_env(spec)
    assert failpoint is not None
    return failpoint


def test_no_spec_means_no_failpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADRACE_FAILPOINTS", raising=False)
    assert failpoint_from_env() is None
    assert failpoint_from_env("") is None


def test_the_spec_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, sleep: ControlledSleep) -> None:
    monkeypatch.setenv("HEADRACE_FAILPOINTS", "state=sleep:0")
    sleep.release.set()
    failpoint = failpoint_from_env()
    assert failpoint is not None
    failpoint("state")
    assert sleep.seconds == [0.0]


def test_one_entry_sleeps_its_milliseconds_at_its_step(sleep: ControlledSleep) -> None:
    sleep.release.set()
    failpoint = made("before_commit=sleep:150")
    failpoint("before_commit")
    assert sleep.seconds == [0.15]


def test_several_entries_each_at_their_own_step(sleep: ControlledSleep) -> None:
    sleep.release.set()
    failpoint = made("begin=sleep:5;version=sleep:250;after_commit=sleep:0")
    for step in ("begin", "state", "version", "after_commit"):
        failpoint(step)
    assert sleep.seconds == [0.005, 0.25, 0.0]


def test_a_step_without_an_action_does_nothing(sleep: ControlledSleep, tmp_path: Path) -> None:
    failpoint = made(f"before_commit=sleep:100:{tmp_path}")
    for step in ("begin", "state", "after_commit"):
        failpoint(step)
    assert sleep.seconds == []
    assert list(tmp_path.iterdir()) == []


def test_the_marker_exists_exactly_while_the_failpoint_sleeps(sleep: ControlledSleep, tmp_path: Path) -> None:
    failpoint = made(f"before_commit=sleep:200:{tmp_path}")
    marker = tmp_path / str(os.getpid())
    committing = threading.Thread(target=failpoint, args=("before_commit",))
    committing.start()
    try:
        assert sleep.asleep.wait(timeout=30), "the failpoint never slept"
        assert marker.exists()
    finally:
        sleep.release.set()
        committing.join(timeout=30)
    assert not committing.is_alive()
    assert not marker.exists()
    assert sleep.seconds == [0.2]


def test_two_steps_asleep_at_once_in_one_process_each_keep_their_own_marker(sleep: ControlledSleep,
                                                                            tmp_path: Path) -> None:
    """As the Kafka chaos test's driver does: its Kafka sink and its Delta sink write from two threads
    of one process, each sleeping at its own step; a marker is named by pid, so each step has its
    own directory, and each marker exists while its step sleeps, whatever the other does."""
    kafka, delta = tmp_path / "kafka", tmp_path / "delta"
    kafka.mkdir()
    delta.mkdir()
    failpoint = made(f"sink_commit=sleep:100:{kafka};lake_commit=sleep:300:{delta}")
    threads = [threading.Thread(target=failpoint, args=(step,)) for step in ("sink_commit", "lake_commit")]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(sleep.seconds) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sorted(sleep.seconds) == [0.1, 0.3], "both steps asleep"
        assert [p.name for p in kafka.iterdir()] == [p.name for p in delta.iterdir()] == [str(os.getpid())]
    finally:
        sleep.release.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert list(kafka.iterdir()) == list(delta.iterdir()) == []


def test_a_real_sleep_lasts_at_least_its_milliseconds(tmp_path: Path) -> None:
    failpoint = made(f"begin=sleep:30:{tmp_path}")
    began = time.monotonic()
    failpoint("begin")
    assert time.monotonic() - began >= 0.03
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spec, part", [
    ("commit=sleep:5", "commit=sleep:5"),                                   # unknown step
    ("begin=crash:5", "begin=crash:5"),                                     # unknown action
    ("begin=sleep:fast", "begin=sleep:fast"),                               # non-numeric ms
    ("begin=sleep:-5", "begin=sleep:-5"),                                   # negative ms
    ("begin=sleep", "begin=sleep"),                                         # no ms
    ("begin", "begin"),                                                     # no action
    ("begin=sleep:5;state=sleep:1.5", "state=sleep:1.5"),                   # the bad one of several
])
def test_bad_entries_are_refused_word_for_word(spec: str, part: str) -> None:
    message = f"HEADRACE_FAILPOINTS entries read step=sleep:MS[:MARK_DIR] (got {part!r}). Hint: steps are {STEPS}"
    with pytest.raises(OptionError, match="^" + re.escape(message) + "$"):
        failpoint_from_env(spec)
