"""Monoid computations in the engine (docs/architecture.md §3.13): folding before the shard does not
depend on how records are split or ordered; a monoid equals its plain version step by step; delta
rows are compacted; bad monoids are refused or named."""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace import MonoidComputation, Topology, key_by
from headrace.engine import InputRecord, ShardBatch, run_shard_batch
from headrace.engine.monoid import COMPACT_EVERY

from ...monoids import preaggregate
from headrace.errors import TopologyError, UserCodeError
from headrace.model import END_OF_TIME, ComputationOptions
from headrace.schema import StreamSchema
from headrace.store import open_store
from headrace.testing import Harness

from ...monoids import Adding
from ...spark.pipelines import MonoidWindowSum
from ...spark.pipelines import PlainWindowSum as PlainWindowSumOnSpark


WindowSum, PlainWindowSum = MonoidWindowSum, PlainWindowSumOnSpark  # sums of n per key and 1 s window


class Bag(WindowSum):
    """A commutative monoid that remembers every value (a multiset), so a lost or doubled record shows."""

    def zero(self) -> Counter[int]:
        return Counter()

    def lift(self, record: Any) -> Counter[int]:
        return Counter([record.value["n"]])

    def combine(self, a: Counter[int], b: Counter[int]) -> Counter[int]:
        a.update(b)  # in place on a, never on b (the contract)
        return a

    def emit(self, ctx: Any, timer: Any, aggregate: Counter[int]) -> None:
        ctx.produce("sums", {"key": ctx.key, "end": timer.timestamp, "bag": sorted(aggregate.elements())})


record_lists = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 9_999), st.integers(0, 9)),
                        max_size=60)


def as_records(rows: list[tuple[str, int, int]]) -> list[InputRecord]:
    return [InputRecord("in", key, {"n": n}, ts, f"r{i}") for i, (key, ts, n) in enumerate(rows)]


@settings(max_examples=200, deadline=None)
@given(rows=record_lists, cuts=st.lists(st.integers(0, 60), max_size=6), seed=st.integers(0, 2**32 - 1))
def test_folding_split_and_shuffled_reads_gives_the_plain_fold(rows: list[tuple[str, int, int]], cuts: list[int],
                                                                seed: int) -> None:
    records = as_records(rows)
    rng = random.Random(seed)
    rng.shuffle(records)
    bounds = sorted({0, len(records), *(c for c in cuts if c <= len(records))})
    partials = []
    for lo, hi in zip(bounds, bounds[1:]):  # each slice is one read task
        folded, alone = preaggregate(Bag(), "Bag", records[lo:hi], watermark_before=0)
        assert alone == []
        partials.extend(folded)
    rng.shuffle(partials)  # the shuffle delivers partials in any order
    merged: dict[tuple[str, int], Counter[int]] = {}
    counts: Counter[tuple[str, int]] = Counter()
    for p in partials:
        merged[(p.key, p.window)] = Bag().combine(merged.get((p.key, p.window), Counter()), p.aggregate)
        counts[(p.key, p.window)] += p.records
    plain: dict[tuple[str, int], Counter[int]] = {}
    for key, ts, n in rows:
        plain.setdefault((key, ts - ts % 1000 + 1000), Counter())[n] += 1
    assert merged == plain
    assert counts == Counter({w: sum(bag.values()) for w, bag in plain.items()})


@settings(max_examples=40, deadline=None)
@given(rows=record_lists, cuts=st.lists(st.integers(0, 60), max_size=4), seed=st.integers(0, 2**32 - 1))
def test_a_shard_batch_of_partials_and_lone_records_emits_the_plain_fold(tmp_path_factory: Any,
                                                                         rows: list[tuple[str, int, int]],
                                                                         cuts: list[int], seed: int) -> None:
    """Partials from several reads, in any order, plus records that travelled alone (late ones among
    them), through the real shard path and SQLite store: each window is emitted once, with the bag
    of every record of it."""
    records = as_records(rows)
    rng = random.Random(seed)
    rng.shuffle(records)
    bounds = sorted({0, len(records), *(c for c in cuts if c <= len(records))})
    partials, alone = [], []
    for lo, hi in zip(bounds, bounds[1:]):
        folded, rest = preaggregate(Bag(), "Bag", records[lo:hi], watermark_before=3_000)
        partials.extend(folded)
        alone.extend(rest)
    assert all(r.timestamp < 3_000 for r in alone)
    rng.shuffle(partials)
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('monoid')}/store.db")
    options = ComputationOptions.from_kwargs("Bag", {"shards": 1, "late": "deliver"})
    store.register("Bag", 1)
    seq = store.acquire_writer("Bag")
    first = ShardBatch("Bag", 0, 1, alone, 3_000, 3_000, 0, seq, partials=partials)
    out = run_shard_batch(Bag(), "Bag", options, None, store, first).productions
    out += run_shard_batch(Bag(), "Bag", options, None, store,
                           ShardBatch("Bag", 0, 2, [], 3_000, END_OF_TIME, 0, seq)).productions
    store.close()
    plain: dict[tuple[str, int], list[int]] = {}
    for key, ts, n in rows:
        plain.setdefault((key, ts - ts % 1000 + 1000), []).append(n)
    emitted = [((p.value["key"], p.value["end"]), p.value["bag"]) for p in out]
    assert sorted(emitted) == sorted((w, sorted(ns)) for w, ns in plain.items())


steps = st.lists(st.one_of(
    st.tuples(st.just("record"), st.sampled_from(["a", "b", "c"]), st.integers(0, 10_000), st.integers(0, 9)),
    st.tuples(st.just("watermark"), st.integers(0, 11_000))), max_size=40)


@settings(max_examples=30, deadline=None)
@given(steps=steps, late=st.sampled_from(["drop", "deliver"]))
def test_a_monoid_equals_its_plain_version_step_by_step(steps: list[tuple[Any, ...]], late: str) -> None:
    """Records (late ones too) and watermark moves, one committed batch each, on the harness: the
    monoid emits what the plain computation emits, at each step, and counts the same."""
    monoid, plain = Harness(WindowSum, late=late), Harness(PlainWindowSum, late=late)
    mark = 0
    for step in [*steps, ("watermark", END_OF_TIME)]:
        if step[0] == "record":
            _, key, ts, n = step
            got, want = monoid.process(key, {"n": n}, ts), plain.process(key, {"n": n}, ts)
        else:
            mark = max(mark, step[1])
            got, want = monoid.advance_watermark(mark), plain.advance_watermark(mark)
        assert sorted(map(_value, got)) == sorted(map(_value, want))
    assert monoid.counters == plain.counters


def _value(record: Any) -> tuple[Any, ...]:
    return tuple(sorted(record.value.items()))


def test_delta_rows_are_compacted_every_few_batches_and_still_sum_exactly() -> None:
    h = Harness(WindowSum, shards=1)
    for i in range(COMPACT_EVERY + 4):
        h.process("a", {"n": i}, 50)  # one window; a batch each, so a delta row each
    rows = h.store.load_partials("MonoidWindowSum", 0, None)[("a", 1000)]
    assert len(rows) == 1 + 4  # batches 1..32 compacted into one row at batch 32, then one row per batch after it
    assert [r.value["sum"] for r in h.advance_watermark(1000)] == [sum(range(COMPACT_EVERY + 4))]
    assert h.store.load_partials("MonoidWindowSum", 0, None) == {}


def test_a_batch_written_twice_without_the_version_check_merges_once() -> None:
    """At-least-once commits skip the version check; the delta row's key (computation, key, window,
    batch) keeps a second write of the same batch from adding its partial again."""
    h = Harness(WindowSum, shards=1, semantics="at_least_once")
    batch = ShardBatch(h.name, 0, 7, [InputRecord("in", "a", {"n": 5}, 10, "x")], 0, 0, 0, h.sequencer)
    for _ in range(2):
        run_shard_batch(WindowSum(), h.name, h.options, None, h.store, batch)
    assert len(h.store.load_partials(h.name, 0, None)[("a", 1000)]) == 1
    assert [r.value["sum"] for r in h.advance_watermark(1000)] == [5]


def test_a_monoid_missing_a_hook_is_refused() -> None:
    class NoEmit(MonoidComputation):
        zero, lift, combine = Adding.zero, Adding.lift, Adding.combine

    with pytest.raises(TopologyError, match=r"^Monoid computation 'NoEmit' does not define emit \(got .*NoEmit.*\)\. "
                                            r"Hint: a MonoidComputation defines zero\(\), lift\(record\), "
                                            r"combine\(a, b\) and emit\(ctx, timer, aggregate\)$"):
        Topology("t").add(NoEmit, inputs={}, outputs=[])


def test_a_monoid_with_per_record_code_is_refused() -> None:
    class Both(WindowSum):
        def process_record(self, ctx: Any, record: Any) -> None:
            pass

    t = Topology("t")
    t.inject("in", [])
    with pytest.raises(TopologyError, match=r"^Monoid computation 'Both' defines process_record or process_timer "
                                            r"\(got .*\)\. Hint: a MonoidComputation folds records with lift and "
                                            r"combine and produces in emit; subclass Computation for per-record code$"):
        t.add(Both, inputs={"in": key_by("k")}, outputs=["sums"])


def test_a_window_that_is_not_an_integer_names_the_record() -> None:
    class Seconds(WindowSum):
        def window(self, record: Any) -> Any:
            return record.timestamp / 1000

    with pytest.raises(UserCodeError, match=r"^Computation 'Seconds' failed on key 'a' at record 'r1' \(timestamp 1500\) "
                                            r"\(got TypeError: window\(record\) returned 1\.5 of type float, not "
                                            r"integer milliseconds\)\. Hint: fix the computation"):
        Harness(Seconds).process("a", {"n": 1}, 1500, id="r1")


def test_a_window_that_is_not_an_integer_is_dead_lettered_with_that_policy() -> None:
    class Seconds(WindowSum):
        def window(self, record: Any) -> Any:
            return record.timestamp / 1000

    h = Harness(Seconds, on_error="dead_letter")
    [letter] = h.process("a", {"n": 1}, 1500, id="r1")
    assert letter.value["record_id"] == "r1" and "not integer milliseconds" in letter.value["error"]
    assert h.counters["dead_lettered"] == 1


def test_a_failing_combine_fails_the_batch_whatever_the_policy() -> None:
    class Broken(WindowSum):
        def combine(self, a: int, b: int) -> int:
            raise ValueError("no")

    with pytest.raises(UserCodeError, match=r"^Monoid computation 'Broken' failed in combine on key 'a' \(got "
                                            r"ValueError: no\)\. Hint: combine\(a, b\) must accept any two "
                                            r"aggregates; fix it and run again: the batch was not committed$"):
        Harness(Broken, on_error="dead_letter").process("a", {"n": 1}, 10)


def test_setting_ctx_state_in_emit_is_refused() -> None:
    class Stateful(WindowSum):
        def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
            ctx.state = aggregate

    h = Harness(Stateful)
    h.process("a", {"n": 1}, 10)
    with pytest.raises(UserCodeError, match=r"^Monoid computation 'Stateful' set ctx\.state for key 'a' \(got a "
                                            r"ctx\.state assignment in emit\)\. Hint: a monoid computation's state "
                                            r"is its aggregate"):
        h.advance_watermark(1000)


class FailingEmit(WindowSum):
    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("sums", aggregate)
        raise RuntimeError("boom")


def test_an_emit_that_raises_fails_the_batch_and_names_the_window() -> None:
    h = Harness(FailingEmit)
    h.process("a", {"n": 1}, 10)
    with pytest.raises(UserCodeError, match=r"^Computation 'FailingEmit' failed on key 'a' at emit of window 1000 "
                                            r"\(got RuntimeError: boom\)\. Hint: fix the computation and run again"):
        h.advance_watermark(1000)


def test_an_emit_that_raises_is_undone_and_dead_lettered_with_that_policy() -> None:
    h = Harness(FailingEmit, on_error="dead_letter")
    h.process("a", {"n": 1}, 10)
    [letter] = h.advance_watermark(1000)  # its production undone; only the dead letter
    assert letter.value["at"] == "emit of window 1000" and letter.value["error"] == "RuntimeError: boom"
    assert h.store.load_partials(h.name, 0, None) == {} and h.timers("a") == []


TYPED = {"in": StreamSchema("n BIGINT")}


def test_a_value_that_does_not_fit_its_typed_stream_is_not_folded_and_its_shard_dead_letters_it(
        tmp_path: Any) -> None:
    """A misfit travels alone from the read to the shard, which dead-letters it with the reason
    (a folded value would have been summed unchecked); the other records' windows are emitted."""
    records = [InputRecord("in", "a", {"n": 1}, 1_000, "r0"), InputRecord("in", "a", {"n": "two"}, 1_200, "r1"),
               InputRecord("in", "a", {"n": 3, "x": 0}, 1_400, "r2"), InputRecord("in", "a", {"n": 4}, 2_500, "r3")]
    partials, alone = preaggregate(Bag(), "Bag", records, watermark_before=0, schemas=TYPED)
    assert [r.id for r in alone] == ["r1", "r2"]
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    options = ComputationOptions.from_kwargs("Bag", {"shards": 1, "on_error": "dead_letter"})
    store.register("Bag", 1)
    batch = ShardBatch("Bag", 0, 1, alone, 0, END_OF_TIME, 0, store.acquire_writer("Bag"), partials=partials)
    out = run_shard_batch(Bag(), "Bag", options, None, store, batch, schemas=TYPED).productions
    store.close()
    assert [(p.value["end"], p.value["bag"]) for p in out if p.stream == "sums"] == [(2_000, [1]), (3_000, [4])]
    letters = [p.value for p in out if p.stream == "Bag.dead_letter"]
    assert [d["record_id"] for d in letters] == ["r1", "r2"]
    assert letters[1]["error"] == (
        "SchemaMismatchError: A value produced to typed stream 'in' does not fit its schema: field 'x' is not in "
        "the schema (`n` BIGINT) (got {'n': 3, 'x': 0}). Hint: produce a dict with the fields `n` BIGINT")


def test_a_monoid_checks_what_it_emits_to_a_typed_stream() -> None:
    h = Harness(WindowSum, schemas={"monoid_sums": "key STRING, total BIGINT"})
    h.process("a", {"n": 1}, 100, id="r1")
    with pytest.raises(UserCodeError, match=re.escape(
            "A value produced to typed stream 'monoid_sums' does not fit its schema: field 'end' is not in the "
            "schema (`key` STRING, `total` BIGINT)")):
        h.advance_watermark(1_000)
