"""Exactly-once across crashes (docs/architecture.md §2.1-§2.3): crash a shard commit at every step, retry it.

A crash is a ``SimulatedCrash`` raised by the store's ``failpoint`` hook at one of
``COMMIT_STEPS``. The crashed store object is then thrown away and the very same ``ShardBatch``
is retried through ``engine.run_shard_batch`` on a fresh store object opened on the same URL, as
a new process would. User code is not deterministic (``random.random()``): it appends each value
to the key's state and produces it, so any double execution, lost commit or re-run after a
commit shows up as a mismatch between the state and the productions.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from headrace import Computation
from headrace.engine import (InputRecord, Production, ShardBatch, ShardCommit, ShardResult, TxState, run_shard_batch,
                             shard_of)
from headrace.model import ComputationOptions
from headrace.store import COMMIT_STEPS

NAME = "appender"
SHARDS = 2
BATCHES = 4
KEYS = [f"k{i}" for i in range(6)]
CRASHED = (3, 0)  # (batch, shard) whose first attempt crashes
BEFORE_COMMIT = COMMIT_STEPS[:COMMIT_STEPS.index("after_commit")]
MAIN_COMMIT = COMMIT_STEPS[:COMMIT_STEPS.index("after_commit") + 1]  # the steps but at-most-once output's
BETWEEN_WEAK_AND_COMMIT = BEFORE_COMMIT[1:]  # after the weak productions' own transaction


class SimulatedCrash(BaseException):
    """The process dies here: a BaseException, so no ``except Exception`` on the way can swallow it."""


class RandomAppender(Computation):
    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []  # (record id, value) of every invocation, crashed or not

    def process_record(self, ctx: Any, record: Any) -> None:
        value = random.random()
        self.calls.append((record.id, value))
        ctx.state = (ctx.state or []) + [value]
        ctx.set_timer(f"t-{record.id}", record.timestamp + 10**9)  # pending, never due here
        ctx.produce("out", value, key=ctx.key)


def records_of(batch: int, shard: int) -> list[InputRecord]:
    """Half the ids positional, as an injector gives them (kept as ranges), half arbitrary (kept exactly)."""
    return [InputRecord("in", key, {"n": i}, batch * 100 + i, f"inject:in:{batch}:{i}" if i % 2 else f"in-{batch}-{i}")
            for i, key in enumerate(KEYS * 2) if shard_of(key, SHARDS) == shard]


@dataclass
class Divergence:
    """How the store departs from exactly once (one committed execution per record, whose value is
    in its key's state and once in the stream); empty when exactly once held."""

    # (id, value) in the stream that no key's state holds
    escaped: list[tuple[str, float]] = field(default_factory=list)
    # (key, value) in a key's state that the stream lacks
    lost: list[tuple[str, float]] = field(default_factory=list)
    # keys whose state and stream share their values but not in the same order or number
    keys_differing: list[str] = field(default_factory=list)
    # record id -> how many of its executions the state holds, where not exactly one
    executions: dict[str, int] = field(default_factory=dict)
    # versions, counters, seen ids, number of values in states -> (expected, found), where they differ
    bookkeeping: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # (batch, shard) whose stored productions are not those its committing attempt returned: what a
    # re-delivery of that batch would hand out
    redelivered_otherwise: list[tuple[int, int]] = field(default_factory=list)


def test_every_shard_gets_records() -> None:  # the scenario below is only meaningful if it holds
    assert all(records_of(1, shard) for shard in range(SHARDS))


class Scenario:
    """One computation driven batch by batch on a store that can crash and be reopened."""

    def __init__(self, reopen: Callable[[], Any], productions: str):
        self.reopen = reopen
        self.options = ComputationOptions.from_kwargs(NAME, {"shards": SHARDS, "productions": productions})
        self.store = reopen()
        self.store.register(NAME, SHARDS)
        self.sequencer = self.store.acquire_writer(NAME)
        self.observer = reopen()  # another process looking at the store
        self.computation = RandomAppender()
        self.results: dict[tuple[int, int], ShardResult] = {}

    def batch(self, batch: int, shard: int) -> ShardBatch:
        return ShardBatch(NAME, shard, batch, records_of(batch, shard), 0, 0, 0, self.sequencer, frozenset({"in"}))

    def run(self, batch: ShardBatch) -> ShardResult:
        result = run_shard_batch(self.computation, NAME, self.options, None, self.store, batch)
        self.results[(batch.batch, batch.shard)] = result
        return result

    def crash(self, batch: ShardBatch, step: str) -> tuple[list[ShardCommit], list[dict[str, Any]]]:
        """Run ``batch`` until it crashes at ``step``; returns the commits attempted and what the
        observer saw at the moment of the crash. Leaves a fresh store object in place."""
        commits: list[ShardCommit] = []
        at_crash: list[dict[str, Any]] = []
        crashing, commit_shard = self.store, self.store.commit_shard

        def recording_commit(c: ShardCommit) -> None:
            commits.append(c)
            commit_shard(c)

        def failpoint(at: str) -> None:
            if at == step:
                at_crash.append(self.observe())
                raise SimulatedCrash(at)

        crashing.commit_shard, crashing.failpoint = recording_commit, failpoint
        with pytest.raises(SimulatedCrash, match=f"^{step}$"):
            self.run(batch)
        crashing.close()
        self.store = self.reopen()
        return commits, at_crash

    def observe(self) -> dict[str, Any]:
        s = self.observer
        return {
            "versions": s.shard_versions(NAME),
            "state": {k: s.state(NAME, k) for k in KEYS},
            "timers": {k: s.timers(NAME, k) for k in KEYS},
            "seen": {shard: sorted(s.all_seen_ids(NAME, shard)) for shard in range(SHARDS)},
            "segments": list(s.read_segments("out", NAME, 0, BATCHES)),
            "counters": s.counters(NAME),
            "crashed": s.committed_productions(NAME, CRASHED[1], CRASHED[0]),
        }

    def states(self) -> dict[str, list[float]]:
        raws = {k: self.store.state(NAME, k) for k in KEYS}
        return {k: pickle.loads(raw) for k, raw in raws.items() if raw is not None}

    def divergence(self) -> Divergence:
        """(c) as a difference: what the store holds against one committed execution per record."""
        states = self.states()
        stream = [r for _, r in self.store.read_segments("out", NAME, 0, BATCHES)]
        held = {(k, v) for k, vs in states.items() for v in vs}
        delivered = {(r.key, r.value) for r in stream}
        keys_differing = [k for k in KEYS if [r.value for r in stream if r.key == k and (k, r.value) in held]
                          != [v for v in states.get(k, []) if (k, v) in delivered]]
        inputs = [r for b in range(1, BATCHES + 1) for s in range(SHARDS) for r in records_of(b, s)]
        in_state = {v for _, v in held}
        executions = Counter(rid for rid, v in self.computation.calls if v in in_state)
        books = {  # what: (expected, found)
            "versions": ({s: BATCHES for s in range(SHARDS)}, self.store.shard_versions(NAME)),
            "counters": ({"records": len(inputs)}, self.store.counters(NAME)),
            "seen ids": (sorted(r.id for r in inputs),
                         sorted(i for s in range(SHARDS) for i in self.store.all_seen_ids(NAME, s))),
            "values in states": (len(inputs), sum(map(len, states.values()))),
        }
        return Divergence(
            escaped=[(r.id, r.value) for r in stream if (r.key, r.value) not in held],
            lost=sorted(held - delivered),
            keys_differing=keys_differing,
            executions={rid: executions[rid] for rid in {r.id for r in inputs} | executions.keys()
                        if executions[rid] != 1},
            bookkeeping={what: pair for what, pair in books.items() if pair[0] != pair[1]},
            redelivered_otherwise=[(b, shard) for (b, shard), result in self.results.items()
                                   if result.productions != self.store.committed_productions(NAME, shard, b)],
        )

    def check_exactly_once(self) -> None:
        """(c): the final state holds exactly the produced values, one execution per record."""
        assert self.divergence() == Divergence()


@pytest.mark.parametrize("productions, visited", [("strong", MAIN_COMMIT[1:]), ("weak", MAIN_COMMIT)])
def test_a_commit_goes_through_the_steps_in_order(reopen: Any, productions: str, visited: tuple) -> None:
    run = Scenario(reopen, productions)
    steps: list[str] = []
    run.store.failpoint = steps.append
    assert run.run(run.batch(1, 0)).state is TxState.COMMITTED
    assert tuple(steps) == visited  # strong productions never write anything before the main transaction


@pytest.mark.parametrize("step", MAIN_COMMIT[1:])
def test_a_crash_at_any_step_then_a_retry_commits_exactly_once(reopen: Any, step: str) -> None:
    run = Scenario(reopen, "strong")
    for b in range(1, BATCHES + 1):
        for shard in range(SHARDS):
            batch = run.batch(b, shard)
            if (b, shard) != CRASHED:
                assert run.run(batch).state is TxState.COMMITTED
                continue
            before = run.observe()
            calls = len(run.computation.calls)
            commits, at_crash = run.crash(batch, step)
            assert len(commits) == 1 and len(run.computation.calls) == calls + len(batch.records)
            crashed_values = [v for _, v in run.computation.calls[calls:]]
            assert [p.value for p in commits[0].productions] == crashed_values
            after = run.observe()
            if step in BEFORE_COMMIT:
                # (a) nothing of the crashed attempt is visible, neither during the crash nor after it
                assert at_crash == [before] and after == before and after["crashed"] == []
                result = run.run(batch)
                assert result.state is TxState.COMMITTED
                assert len(run.computation.calls) == calls + 2 * len(batch.records)  # the retry ran user code
                assert not set(p.value for p in result.productions) & set(crashed_values)
            else:
                # (b) the crashed attempt committed: the retry re-delivers it without running user code
                assert at_crash == [after] and after != before
                assert after["versions"][shard] == b and after["crashed"] == commits[0].productions
                result = run.run(batch)
                assert result.state is TxState.REDELIVERED and result.redelivered
                assert len(run.computation.calls) == calls + len(batch.records)
                assert result.productions == commits[0].productions  # same ids, same random values
                assert [p.value for p in result.productions] == crashed_values
            assert run.observe()["versions"][shard] == b
            assert len(result.productions) == len(batch.records)
            assert run.run(batch).state is TxState.REDELIVERED  # and any further retry re-delivers too
    run.check_exactly_once()


def test_a_retry_on_the_crashed_store_object_itself_also_recovers(reopen: Any) -> None:
    """A task retried in the same process, on the store object that saw the crash."""
    run = Scenario(reopen, "strong")
    crashing = run.store

    def failpoint(at: str) -> None:
        if at == "before_commit":
            raise SimulatedCrash(at)

    for b in range(1, BATCHES + 1):
        for shard in range(SHARDS):
            if (b, shard) == CRASHED:
                crashing.failpoint = failpoint
                with pytest.raises(SimulatedCrash):
                    run.run(run.batch(b, shard))
                crashing.failpoint = None
            assert run.run(run.batch(b, shard)).state is TxState.COMMITTED
    run.check_exactly_once()


@pytest.mark.parametrize("step", BETWEEN_WEAK_AND_COMMIT)
@pytest.mark.parametrize("productions", ["strong", "weak"])
def test_weak_productions_escape_a_crashed_attempt_and_strong_ones_do_not(reopen: Any, productions: str,
                                                                           step: str) -> None:
    """The documented weakness of ``productions="weak"``: they are sent before the commit and never
    taken back, so after a crash the stream holds the crashed attempt's values as well as the
    retry's, which differ (user code is not deterministic). Strong productions, checkpointed with
    the state, never escape."""
    run = Scenario(reopen, productions)
    escaped: list[Production] = []
    retried: list[Production] = []
    for b in range(1, BATCHES + 1):
        for shard in range(SHARDS):
            batch = run.batch(b, shard)
            if (b, shard) != CRASHED:
                run.run(batch)
                continue
            before = run.observe()
            commits, _ = run.crash(batch, step)
            after = run.observe()
            escaped = after["crashed"]
            assert after["state"] == before["state"] and after["versions"] == before["versions"]
            result = run.run(batch)
            assert result.state is TxState.COMMITTED
            retried = result.productions
            assert len(retried) == len(batch.records)
            if productions == "weak":
                assert escaped == commits[0].productions  # delivered before the commit, never taken back
            else:
                assert escaped == [] and after == before
    if productions == "weak":
        # each record of the crashed batch was delivered twice under one id, with different values: the
        # crashed attempt's, which no state holds, and the retry's, which the state holds; nothing was
        # lost; and the crashed attempt's hold the shard's slot, so a re-delivery would hand them out
        assert escaped and [p.id for p in escaped] == [p.id for p in retried]
        assert all(e.value != r.value for e, r in zip(escaped, retried))
        assert run.divergence() == Divergence(escaped=[(p.id, p.value) for p in escaped],
                                              redelivered_otherwise=[CRASHED])
    else:
        run.check_exactly_once()
