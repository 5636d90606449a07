"""Timers (DESIGN §2.5): in increasing timestamp order per key, exactly once, never early, after the
records behind them, surviving restarts; wall timers on the wall clock only."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace import Computation
from headrace.engine import InputRecord, ShardBatch, run_shard_batch
from headrace.errors import OptionError
from headrace.model import BEGINNING_OF_TIME, ComputationOptions, Timer
from headrace.store import open_store
from headrace.testing import Harness


class Scheduler(Computation):
    """A record's value is a command: {"set": {tag: ts}, "wall": {tag: ts}, "delete": [tag]}.
    Each record is remembered in state; each firing is reported with what the key had seen."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = [*(ctx.state or []), record.timestamp]
        for tag, ts in record.value.get("set", {}).items():
            ctx.set_timer(tag, ts)
        for tag, ts in record.value.get("wall", {}).items():
            ctx.set_timer(tag, ts, domain="wall")
        for tag in record.value.get("delete", []):
            ctx.delete_timer(tag)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("fired", {"key": ctx.key, "tag": timer.tag, "at": timer.timestamp, "domain": timer.domain,
                              "seen": list(ctx.state or []), "watermark": ctx.low_watermark})


def fired(h: Harness, key: str | None = None) -> list[tuple[str, int]]:
    return [(r.value["tag"], r.value["at"]) for r in h.productions("fired") if key in (None, r.value["key"])]


# -- order, once, never early nor late -------------------------------------------------------------

keys = st.sampled_from(["a", "b", "c", "d", "e"])
# (key, timer due time, record timestamp): a record of the key, given at that timestamp (or at the
# watermark if that is later: never late), that sets one timer
plans = st.lists(st.tuples(keys, st.integers(0, 2_000), st.integers(0, 2_000)), min_size=1, max_size=15)


def first_step_reaching(steps: list[tuple[str, Any]], after: int, due: int) -> int | None:
    """The first advance step after step ``after`` whose watermark reaches ``due``: where a timer set
    at step ``after`` must fire, neither earlier (never early) nor later (never late)."""
    return next((i for i, (kind, arg) in enumerate(steps) if i > after and kind == "advance" and arg >= due), None)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans, advances=st.lists(st.integers(0, 2_200), min_size=1, max_size=6),
       interleave=st.integers(0, 14), shards=st.integers(1, 3))
def test_watermark_timers_fire_once_in_increasing_order_per_key_when_the_watermark_reaches_them(
        plan: list[tuple[str, int, int]], advances: list[int], interleave: int, shards: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        h = Harness(Scheduler, store=f"sqlite:///{folder}/h.db", shards=shards)
        steps: list[tuple[str, Any]] = [("set", item) for item in plan]
        for target in sorted(advances):  # watermark advances spliced in among the timer settings
            steps.insert(min(interleave, len(steps)), ("advance", target))
            interleave += 3
        watermark = BEGINNING_OF_TIME
        set_at: dict[tuple[str, str], tuple[int, int]] = {}  # (key, tag) -> (step it was first set, due time)
        given_records: list[tuple[str, int]] = []  # (key, timestamp) of every record given, in order
        fire_step: dict[tuple[str, str], int] = {}
        for step, (kind, arg) in enumerate(steps):
            if kind == "set":
                key, due, stamp = arg
                if due <= watermark:
                    continue  # a timer already due when set is another test
                tag, stamp = f"t{due}", max(watermark, stamp)
                set_at.setdefault((key, tag), (step, due))
                given_records.append((key, stamp))
                out = h.process(key, {"set": {tag: due}}, stamp)
            else:
                watermark = max(watermark, arg)
                out = h.advance_watermark(watermark)
            for r in out:
                assert r.value["watermark"] == watermark
                assert (r.value["key"], r.value["tag"]) not in fire_step  # exactly once
                fire_step[(r.value["key"], r.value["tag"])] = step
                # after every record of its key with a timestamp below it (one given later would be late)
                below = [ts for k, ts in given_records if k == r.value["key"] and ts < r.value["at"]]
                assert [ts for ts in r.value["seen"] if ts < r.value["at"]] == below
        for key in "abcde":
            stamps = [at for _, at in fired(h, key)]
            assert stamps == sorted(stamps)  # increasing timestamp order per key
        # each fired in the first step whose watermark reached it, never before, never after; the
        # others are still pending
        expected = {kt: first_step_reaching(steps, step, due) for kt, (step, due) in set_at.items()}
        assert fire_step == {kt: step for kt, step in expected.items() if step is not None}
        for key in "abcde":
            assert [t.timestamp for t in h.timers(key)] == sorted(
                due for (k, tag), (_, due) in set_at.items() if k == key and expected[(k, tag)] is None)
        assert h.counters.get("timers_fired", 0) == len(fire_step)
        h.store.close()


def test_a_timer_fires_after_every_earlier_record_given_before_the_watermark_reached_it() -> None:
    h = Harness(Scheduler, shards=1)
    h.process("k", {"set": {"t": 300}}, 100)
    h.process("k", {}, 250)
    h.process("k", {}, 299)
    h.process("k", {}, 300)  # not behind the timer: may or may not precede it
    assert h.advance_watermark(299) == []
    [fire] = h.advance_watermark(300)
    assert [ts for ts in fire.value["seen"] if ts < 300] == [100, 250, 299]


def test_records_then_timers_in_one_engine_batch(tmp_path: Path) -> None:
    """Records and the watermark move in one batch: the batch's records reach user code first."""
    store = open_store(f"sqlite:///{tmp_path}/e.db")
    store.register("sched", 1)
    seq = store.acquire_writer("sched")
    comp, opts = Scheduler(), ComputationOptions()

    def batch(n: int, records: list[InputRecord], before: int, after: int) -> list[Any]:
        shard_batch = ShardBatch("sched", 0, n, records, before, after, 0, seq, frozenset({"in"}))
        return run_shard_batch(comp, "sched", opts, None, store, shard_batch).productions

    assert batch(1, [InputRecord("in", "k", {"set": {"old": 150}}, 10, "r1")], 0, 0) == []
    records = [InputRecord("in", "k", {"set": {"new": 120}}, 100, "r2"),
               InputRecord("in", "k", {}, 140, "r3"),
               InputRecord("in", "j", {"set": {"j": 130}}, 110, "r4")]
    out = batch(2, records, 0, 200)
    got = {(p.value["key"], p.value["tag"]): p.value["seen"] for p in out}
    assert got == {("k", "new"): [10, 100, 140], ("k", "old"): [10, 100, 140], ("j", "j"): [110]}
    assert [p.value["tag"] for p in out if p.value["key"] == "k"] == ["new", "old"]  # 120 before 150
    store.close()


# -- replace, delete, due on set ----------------------------------------------------------------------


def test_setting_an_existing_tag_replaces_it() -> None:
    h = Harness(Scheduler)
    h.process("k", {"set": {"x": 100}}, 0)
    h.process("k", {"set": {"x": 300}}, 0)  # a later batch
    h.process("k", {"set": {"y": 500}, "wall": {"y": 50}}, 0)  # and within one invocation, across domains
    assert h.timers("k") == [Timer("y", 50, "wall"), Timer("x", 300, "watermark")]
    assert h.advance_watermark(299) == []
    assert fired(h) == []
    h.advance_watermark(1_000)
    assert fired(h) == [("x", 300)]


def test_delete_timer_cancels_it() -> None:
    h = Harness(Scheduler)
    h.process("k", {"set": {"x": 100, "y": 200}}, 0)
    h.process("k", {"delete": ["x"]}, 0)  # a later batch
    h.process("k", {"set": {"z": 150}, "delete": ["z"]}, 0)  # set and deleted in one invocation
    h.process("k", {"delete": ["never-set"]}, 0)  # deleting nothing is harmless
    assert h.timers("k") == [Timer("y", 200)]
    h.advance_watermark(10_000)
    assert fired(h) == [("y", 200)]
    assert h.timers("k") == []


class Chain(Computation):
    """Each timer sets the next one, ``step`` later; due ones fire within the same step."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.set_timer("chain", record.value["first"])

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("fired", timer.timestamp)
        if timer.tag == "chain" and timer.timestamp < 1_000:
            ctx.set_timer("chain", timer.timestamp + 100)
        if timer.tag == "chain" and timer.timestamp == 200:
            ctx.set_timer("past", timer.timestamp - 1)  # already behind the watermark: due at once


def test_timers_set_from_process_timer_that_are_due_fire_in_the_same_step() -> None:
    h = Harness(Chain)
    h.process("k", {"first": 100}, 0)
    out = h.advance_watermark(450)
    assert [r.value for r in out] == [100, 200, 199, 300, 400]  # 199: set while firing 200, already due
    assert h.timers("k") == [Timer("chain", 500)]
    assert [r.value for r in h.advance_watermark(600)] == [500, 600]
    assert [r.value for r in h.productions("fired")] == [100, 200, 199, 300, 400, 500, 600]


# -- wall clock ------------------------------------------------------------------------------------


def test_wall_timers_fire_on_advance_wall_clock_only() -> None:
    h = Harness(Scheduler)
    h.process("k", {"wall": {"w": 1_000}, "set": {"e": 1_000}}, 0)
    out = h.advance_watermark(5_000)
    assert [(r.value["tag"], r.value["domain"]) for r in out] == [("e", "watermark")]
    assert h.timers("k") == [Timer("w", 1_000, "wall")]
    assert h.advance_wall_clock(999) == []
    out = h.advance_wall_clock(1_000)
    assert [(r.value["tag"], r.value["at"], r.value["domain"]) for r in out] == [("w", 1_000, "wall")]
    assert h.advance_wall_clock(10_000) == []  # once
    assert h.timers("k") == []


# -- restarts -----------------------------------------------------------------------------------------


def test_timers_survive_a_restart_and_fire_once_there(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/h.db"
    first = Harness(Scheduler, store=url, shards=2)
    for key in ("a", "b", "c"):
        first.process(key, {"set": {"early": 100, "late": 900}, "wall": {"w": 50}}, 10)
    first.advance_watermark(50)
    assert fired(first) == []
    first.store.close()

    second = Harness(Scheduler, store=url, shards=2)
    assert second.low_watermark == 50  # resumes from the journal
    assert second.timers("a") == [Timer("w", 50, "wall"), Timer("early", 100), Timer("late", 900)]
    out = second.advance_watermark(500)
    assert sorted((r.value["key"], r.value["tag"]) for r in out) == [("a", "early"), ("b", "early"), ("c", "early")]
    assert all(r.value["seen"] == [10] for r in out)  # the state from before the restart
    assert len(second.advance_wall_clock(50)) == 3
    second.store.close()

    third = Harness(Scheduler, store=url, shards=2)
    assert third.advance_watermark(500) == []  # fired once, not again after another restart
    out = third.advance_watermark(1_000)
    assert sorted((r.value["key"], r.value["tag"]) for r in out) == [("a", "late"), ("b", "late"), ("c", "late")]
    assert [tag for tag, _ in fired(third)] == ["early"] * 3 + ["w"] * 3 + ["late"] * 3
    assert third.counters["timers_fired"] == 9
    third.store.close()


# -- the harness refuses time travel ------------------------------------------------------------------


def test_the_harness_refuses_a_watermark_moving_back() -> None:
    h = Harness(Scheduler)
    h.advance_watermark(1_000)
    with pytest.raises(OptionError, match=re.escape(
            "A low watermark never moves back (got 999). Hint: advance to 1000 or later")):
        h.advance_watermark(999)
    assert h.low_watermark == 1_000
    assert h.advance_watermark(1_000) == []  # standing still is fine


def test_the_harness_refuses_a_wall_clock_moving_back() -> None:
    h = Harness(Scheduler)
    h.advance_wall_clock(1_000)
    with pytest.raises(OptionError, match=re.escape(
            "The harness wall clock never moves back (got 5). Hint: advance to 1000 or later")):
        h.advance_wall_clock(5)
