"""engine/monoid.py's columnar fold: a monoid built from ``headrace.monoids``' hooks folds a typed
stream's field columns (``Folder.add_columns``, ``columnar_parts``) and gets exactly what folding
one record at a time gets, in a continuous worker's pass as in a read task (docs/architecture.md §3.13)."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace import MonoidComputation, Topology, injectors, key_by
from headrace.engine.batch import Production
from headrace.names import id_prefix
from headrace.engine.monoid import ColumnarFold, Folder, columnar_fold, columnar_parts, columnar_totals
from headrace.engine.worker import Worker
from headrace.names import interval as interval_producer
from headrace.errors import UserCodeError
from headrace.model import END_OF_TIME
from headrace.monoids import Tumbling, add, constant, field, tumbling
from headrace.schema import StreamSchema
from headrace.names import CONTINUOUS
from headrace.plans import interval_plans as plans_of, producers_of
from headrace.store import open_store
from headrace.store.segments import DecodedSegment, encode_segment, segment_columns

SCHEMA = "key STRING, n BIGINT, ts BIGINT"
INJECTOR = "inject:events"


class Sum(MonoidComputation):
    lift = field("n")
    window = tumbling(1_000)
    combine = operator.add

    def zero(self) -> int:
        return 0

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("sums", {"key": ctx.key, "end": timer.timestamp, "sum": aggregate})


class Count(Sum):
    lift = constant(1)
    window = MonoidComputation.window


class HandWrittenSum(Sum):
    def combine(self, a: int, b: int) -> int:
        return a + b


class OddWindows(Tumbling):
    def __call__(self, record: Any) -> int:
        return 0


def test_only_the_ready_made_hooks_with_add_or_operator_add_fold_columns() -> None:
    assert columnar_fold(Sum()) == ColumnarFold("n", 0, 1_000, 0)
    assert columnar_fold(type("Added", (Sum,), {"combine": add})()) == ColumnarFold("n", 0, 1_000, 0)
    assert columnar_fold(Count()) == ColumnarFold(None, 1, None, 0)
    assert columnar_fold(type("FloatZero", (Sum,), {"zero": lambda self: 0.0})()) is None  # float sums depend on order
    assert columnar_fold(HandWrittenSum()) is None  # a combine of its own: called per record
    assert columnar_fold(type("Bools", (Count,), {"lift": constant(True)})()) is None  # not an int
    assert columnar_fold(type("Odd", (Sum,), {"window": OddWindows(1_000)})()) is None  # not tumbling's window
    assert columnar_fold(type("Lambda", (Sum,), {"lift": lambda self, r: r.value["n"]})()) is None


rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-3_000, 9_999), st.integers(-5, 9)),
                max_size=60)


@settings(max_examples=200, deadline=None)
@given(rows=rows, before=st.integers(-1_000, 5_000), cls=st.sampled_from([Sum, Count]),
       take=st.lists(st.booleans(), min_size=60, max_size=60))
def test_folding_columns_equals_folding_records(rows: list[tuple[str, int, int]], before: int, cls: type,
                                                take: list[bool]) -> None:
    keys, stamps, parts = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    values, ids = [{"key": k, "n": n, "ts": t} for k, t, n in rows], [f"r{i}" for i in range(len(rows))]
    picked = [i for i in range(len(rows)) if take[i]]
    by_records, by_columns = Folder(cls(), "m", before), Folder(cls(), "m", before)
    for _ in range(2):  # a second read adds to the same slots
        alone = by_records.add_many(keys, values, stamps, ids, picked)
        assert by_columns.add_columns(keys, parts, stamps, picked) == alone  # the late ones, in order
    assert by_columns.slots == by_records.slots
    assert sorted(by_columns.partials()) == sorted(by_records.partials())


def segment(values: list[Any], schema: str | None = SCHEMA) -> DecodedSegment:
    records = [Production("events", None, v, i, f"{INJECTOR}:1:{i}") for i, v in enumerate(values)]
    return segment_columns(encode_segment(records, StreamSchema(schema) if schema else None))


def test_columns_are_read_only_when_the_result_is_sure_to_be_the_same() -> None:
    good = [{"key": "a", "n": 1, "ts": 5}, {"key": "b", "n": 2, "ts": 6}]
    folder, by_key = Folder(Sum(), "m", 0), key_by("key")
    assert columnar_parts(folder, by_key, segment(good), StreamSchema(SCHEMA)) == (["a", "b"], [1, 2])
    assert columnar_parts(folder, by_key, segment(good), None) == (["a", "b"], [1, 2])  # not checked here
    assert columnar_parts(Folder(Count(), "m", 0), by_key, segment(good), None) == (["a", "b"], ["a", "b"])
    refused = {
        "hooks of its own": (Folder(HandWrittenSum(), "m", 0), by_key, segment(good), None),
        "a key function": (folder, key_by(lambda v: v["key"]), segment(good), None),
        "an untyped segment": (folder, by_key, segment(good, None), None),
        "another schema than the reader's": (folder, by_key, segment(good), StreamSchema("key STRING, n BIGINT, ts INT")),
        "a schema that differs only in NOT NULL": (folder, by_key, segment(good),
                                                   StreamSchema("key STRING NOT NULL, n BIGINT, ts BIGINT")),
        "a key field that is no str": (folder, key_by("n"), segment(good), None),
        "a null part (nullable n)": (folder, by_key, segment([*good, {"key": "c", "ts": 7}]), None),
        "a part that is no int": (Folder(type("F", (Sum,), {"lift": field("f")})(), "m", 0), by_key,
                                  segment([{"key": "a", "f": 1.5}], "key STRING, f DOUBLE"), None),
        "no such field": (Folder(type("X", (Sum,), {"lift": field("x")})(), "m", 0), by_key, segment(good), None),
    }
    for why, args in refused.items():
        assert columnar_parts(*args) is None, why
        assert columnar_totals(*args, -10**18) is None, why
    assert columnar_totals(folder, by_key, segment(good), None, 0) == {("a", 1_000): (1, 1), ("b", 1_000): (2, 1)}


def stamped(rows: list[tuple[str, int, int]]) -> DecodedSegment:
    """A typed segment of (key, timestamp, n) rows."""
    records = [Production("events", None, {"key": k, "n": n, "ts": t}, t, f"{INJECTOR}:1:{i}")
               for i, (k, t, n) in enumerate(rows)]
    return segment_columns(encode_segment(records, StreamSchema(SCHEMA)))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "é"]), st.integers(-3_000, 9_999),
                               st.integers(-5, 9)), min_size=1, max_size=60),
       since=st.integers(-4_000, 5_000), cls=st.sampled_from([Sum, Count]))
def test_summing_in_the_stores_columns_equals_folding_the_lists(rows: list[tuple[str, int, int]], since: int,
                                                                cls: type) -> None:
    seg, by_key = stamped(rows), key_by("key")
    by_totals, by_lists = Folder(cls(), "m", since), Folder(cls(), "m", since)
    totals = columnar_totals(by_totals, by_key, seg, None, since)
    keys, parts = columnar_parts(by_lists, by_key, seg, None)
    late = by_lists.add_columns(keys, parts, seg.timestamps, range(len(rows)))
    stamps = [t for _, t, _ in rows]
    negative_window = cls is Sum and min(stamps) < 0  # Arrow divides by truncation: the lists fold those
    assert (totals is None) == (bool(late) or negative_window)
    assert bool(late) == (min(stamps) < since)
    if totals is not None:
        by_totals.add_totals(totals)
        assert by_totals.slots == by_lists.slots


def test_sums_that_could_leave_64_bits_are_folded_from_the_lists() -> None:
    big = 2**62
    seg = stamped([("a", 5, big), ("a", 6, big), ("a", 7, big)])
    folder = Folder(Sum(), "m", 0)
    assert columnar_totals(folder, key_by("key"), seg, None, 0) is None
    keys, parts = columnar_parts(folder, key_by("key"), seg, None)
    folder.add_columns(keys, parts, seg.timestamps, range(3))
    assert folder.slots == {("a", 1_000): [3 * big, 3]}  # Python's ints: exact
    half = big // 2  # |part| times the records stays under 2**63: summed in the columns
    assert columnar_totals(folder, key_by("key"), stamped([("a", 5, half), ("b", 6, -half)]), None, 0) == {
        ("a", 1_000): (half, 1), ("b", 1_000): (-half, 1)}


# -- a continuous worker's pass ------------------------------------------------------------------

EVENTS = [{"key": f"k{i % 7}", "n": i % 5, "ts": 10_000 + i * 37} for i in range(300)]
LATE = [{"key": "k1", "n": 100, "ts": 9_000}, {"key": "k2", "n": 200, "ts": 9_500}]  # behind batch 1's watermark


def no_unpickling(self: DecodedSegment) -> Any:
    raise AssertionError("a value was unpickled: the segment was not folded from its columns")


def worker_run(tmp_path: Path, cls: type, typed: bool, events: list[dict[str, Any]],
               unpickling: pytest.MonkeyPatch | None = None, slots: int = 1) -> dict[str, Any]:
    """``cls`` over ``events`` (two batches, then ``LATE``, then the end) by ``slots`` continuous
    workers; with ``unpickling``, the workers' passes may unpickle no segment whole (``values_at`` may)."""
    t = Topology("columns")
    t.inject("events", injectors.records(events[:1], timestamp="ts"))
    if typed:
        t.stream("events", schema=SCHEMA)
    t.add(cls, inputs={"events": key_by("key")}, outputs=["sums"], shards=3, late="deliver")
    store = open_store(f"sqlite:///{tmp_path}/{cls.__name__}-{typed}-{slots}.db")
    store.register(cls.__name__, 3)
    for stream in t.streams():
        store.declare_stream(stream, *producers_of(t, stream, CONTINUOUS))
    workers = [Worker(store, plans_of(t), f"w{slot}", slot, slots, lease_ms=600_000) for slot in range(slots)]
    for worker in workers:
        worker.maintain_leases()
    half = len(events) // 2
    for batch, (chunk, watermark) in enumerate([(events[:half], 12_000), (events[half:], 13_000), (LATE, 13_000),
                                                 ([], END_OF_TIME)], start=1):
        prefix = id_prefix(INJECTOR, batch)
        records = [Production("events", None, v, v["ts"], f"{prefix}{n}") for n, v in enumerate(chunk)]
        store.publish(INJECTOR, batch, {"events": records}, watermark, str(batch), t.schemas)
        if unpickling is not None:
            unpickling.setattr(DecodedSegment, "values", property(no_unpickling))
        for worker in workers:
            while worker.step():
                pass
        if unpickling is not None:
            unpickling.undo()
    out = sorted((r.value["key"], r.value["end"], r.value["sum"])
                 for shard in range(3) for _, r in store.read_segments("sums", interval_producer(cls.__name__, shard), 0, 99))
    counters = store.counters(cls.__name__)
    for worker in workers:
        worker.release_all()
    store.close()
    return {"out": out, "records": counters["records"], "late": counters["late_delivered"]}


@pytest.mark.parametrize("cls", [Sum, Count])
def test_a_worker_folds_a_typed_stream_from_its_columns_and_gets_what_it_gets_record_by_record(
        tmp_path: Path, cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    by_records = worker_run(tmp_path, cls, typed=False, events=EVENTS)
    oracle: dict[tuple[str, int], int] = {}
    for e in EVENTS + LATE:
        window = e["ts"] - e["ts"] % 1_000 + 1_000 if cls is Sum else END_OF_TIME
        oracle[(e["key"], window)] = oracle.get((e["key"], window), 0) + (e["n"] if cls is Sum else 1)
    assert by_records["out"] == sorted((k, w, s) for (k, w), s in oracle.items())
    assert (by_records["records"], by_records["late"]) == (len(EVENTS) + len(LATE), len(LATE))  # late: delivered
    assert worker_run(tmp_path, cls, typed=True, events=EVENTS, unpickling=monkeypatch) == by_records


@pytest.mark.parametrize("cls", [Sum, Count])
def test_workers_that_each_hold_some_intervals_fold_a_segment_of_every_interval(tmp_path: Path, cls: type) -> None:
    # the injector's segments are not routed (published before any plan), so each of the two
    # workers reads every record and folds those of the intervals it holds, and only those
    one = worker_run(tmp_path, cls, typed=True, events=EVENTS)
    assert worker_run(tmp_path, cls, typed=True, events=EVENTS, slots=2) == one


def test_a_record_without_the_field_is_folded_record_by_record_and_fails_as_it_would_there(tmp_path: Path) -> None:
    # n is nullable, so the value fits and the segment keeps its columns; its null part sends the
    # segment down the per-record path, where lift names the record
    with pytest.raises(UserCodeError, match=r"^Computation 'Sum' failed on key 'k0' at record 'inject:events:2:150' "
                                            r"\(timestamp 12500\): field\('n'\) found no field 'n' in the record's value "
                                            r"\(got \{'key': 'k0', 'ts': 12500\}\)"):
        worker_run(tmp_path, Sum, typed=True, events=[*EVENTS, {"key": "k0", "ts": 12_500}])
