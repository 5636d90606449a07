"""store/segments.py: a segment is an Arrow IPC stream of (key, pickled value, timestamp, id) that
gives back exactly the records it was given."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.engine import Production
from headrace.store.segments import SEGMENT_SCHEMA, decode_segment, encode_segment, segment_rows

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Click:
    user: str
    at: float


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
    | st.builds(Click, st.text(), st.floats(allow_nan=False)),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
productions = st.builds(Production, st.just("clicks"), st.none() | st.text(), values,
                        st.integers(INT64_MIN, INT64_MAX), st.text())


def rows_of(records: list[Production]) -> list[tuple[Any, ...]]:
    return [(p.key, p.value, p.timestamp, p.id) for p in records]


@settings(deadline=None)  # the first Arrow IPC write of a process is slow
@given(records=st.lists(productions, max_size=20))
def test_records_round_trip(records: list[Production]) -> None:
    assert segment_rows(encode_segment(records)) == rows_of(records)


def test_none_keys_extreme_timestamps_and_odd_ids_round_trip() -> None:
    records = [
        Production("s", None, {"nested": [1, (2, 3)]}, INT64_MIN, "p:0:1:1"),
        Production("s", "", None, INT64_MAX, ""),
        Production("s", "ключ", Click("ana", 1.5), 0, "id with spaces / ünïcode"),
    ]
    assert segment_rows(encode_segment(records)) == rows_of(records)


def test_values_travel_as_one_pickle_each() -> None:
    records = [Production("s", "k", {"n": i}, i, f"id-{i}") for i in range(3)]
    cells = decode_segment(encode_segment(records)).column("value").to_pylist()
    assert [pickle.loads(cell) for cell in cells] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_an_empty_segment() -> None:
    data = encode_segment([])
    table = decode_segment(data)
    assert table.num_rows == 0
    assert table.schema == SEGMENT_SCHEMA
    assert segment_rows(data) == []


def test_the_arrow_schema() -> None:
    assert SEGMENT_SCHEMA == pa.schema([
        ("key", pa.string()), ("value", pa.binary()), ("timestamp", pa.int64()), ("id", pa.string()),
    ])
    table = decode_segment(encode_segment([Production("s", None, 1, 2, "i")]))
    assert table.schema == SEGMENT_SCHEMA
    assert table.column("key").null_count == 1
