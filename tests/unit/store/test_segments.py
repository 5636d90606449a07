"""store/segments.py: a segment is an Arrow IPC stream of (key, pickled value, timestamp, id) that
gives back exactly the records it was given; a typed stream's segment keeps its values' fields as
columns too, when every value fits its schema exactly."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.engine import Production
from headrace.schema import StreamSchema
from headrace.store.segments import (SEGMENT_SCHEMA, _string_shards, decode_segment, encode_segment, segment_columns,
                                     segment_rows)

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


class Fields(dict):
    pass


SCHEMA = StreamSchema("user STRING, n BIGINT, score DOUBLE, tags ARRAY<STRING>")


def typed(values: list[Any]) -> list[Production]:
    return [Production("clicks", None, v, i, f"inject:clicks:1:{i}") for i, v in enumerate(values)]


def test_a_typed_streams_segment_keeps_its_fields_as_columns_too() -> None:
    values = [{"user": "ada", "n": 3, "score": 0.5, "tags": ["a"]}, {"user": "bob", "n": -(2**63)},
              {"user": "cy", "n": 2**63 - 1, "score": 2, "tags": []}]
    seg = segment_columns(encode_segment(typed(values), SCHEMA))
    assert seg.fields_schema == SCHEMA.fingerprint
    assert seg.field("user", str) == ["ada", "bob", "cy"]
    assert seg.field("n", int) == [3, -(2**63), 2**63 - 1]
    assert seg.field("n", str) is None and seg.field("user", int) is None  # not of that kind
    assert seg.field("score", int) is None  # a DOUBLE field is neither
    assert seg.field("tags", str) is None  # nor is a list, and a value has no tags: a null
    assert seg.field("nope", int) is None
    assert seg.values == values  # the values themselves are untouched: no field added, 2 stays an int
    assert seg.values[2]["score"] == 2 and type(seg.values[2]["score"]) is int
    assert segment_rows(encode_segment(typed(values), SCHEMA)) == rows_of(typed(values))


def test_values_are_unpickled_only_where_asked() -> None:
    values = [{"user": f"u{i}", "n": i} for i in range(5)]
    seg = segment_columns(encode_segment(typed(values), SCHEMA))
    assert seg.values_at([3, 0]) == [values[3], values[0]]
    assert seg._values is None  # nothing else was unpickled
    assert seg.values == values
    assert seg.values_at([4]) == [values[4]]
    assert len(seg) == 5


@pytest.mark.parametrize("odd, why", [
    ({"user": "ada", "n": 3.0}, "a float in a BIGINT field would read back as the int 3"),
    ({"user": b"ada", "n": 3}, "bytes in a STRING field would read back as a str"),
    ({"user": "ada", "n": 3, "extra": 1}, "a field the schema does not have: the value does not fit"),
    ({"user": "ada", "n": "3"}, "a str in a BIGINT field: the value does not fit"),
    ({"user": np.str_("ada"), "n": 3}, "a numpy str in a STRING field would read back as a str"),
    ({"user": "ada", "n": np.int64(3)}, "a numpy int in a BIGINT field would read back as an int"),
    ("ada", "not a dict"),
    (Fields(user="ada", n=3), "a dict subclass: reading its fields may differ from reading the columns"),
])
def test_a_segment_whose_values_do_not_all_fit_exactly_keeps_no_field_columns(odd: Any, why: str) -> None:
    values = [{"user": "bob", "n": 1}, odd]
    seg = segment_columns(encode_segment(typed(values), SCHEMA))
    assert seg.fields_schema is None, why
    assert seg.field("user", str) is None
    assert seg.values == values  # every value still exactly as it was written


def test_an_untyped_segment_has_no_field_columns() -> None:
    seg = segment_columns(encode_segment(typed([{"user": "ada", "n": 1}])))
    assert seg.fields_schema is None and seg.field("n", int) is None
    assert decode_segment(encode_segment(typed([{"user": "ada", "n": 1}]))).schema == SEGMENT_SCHEMA


@settings(deadline=None)
@given(keys=st.lists(st.none() | st.text(), max_size=40), shards=st.integers(1, 64), start=st.integers(0, 3))
def test_stored_keys_are_hashed_to_intervals_in_columns_as_one_at_a_time(
        keys: list[str | None], shards: int, start: int) -> None:
    from headrace.engine.batch import shard_of

    records = [Production("clicks", k, i, i, f"r{i}") for i, k in enumerate(keys)]
    seg = segment_columns(encode_segment(records))
    assert seg.key_shards(shards) == [None if k is None else shard_of(k, shards) for k in keys]
    sliced = type(seg)(seg.table.slice(min(start, len(keys))))
    assert sliced.key_shards(shards) == [None if k is None else shard_of(k, shards) for k in keys[start:]]
    for column in (pa.array(keys, pa.string()), pa.array(keys, pa.large_string())):
        part = column.slice(min(start, len(keys)))  # starts past its buffers' start
        assert part.offset == min(start, len(keys))
        assert _string_shards(part, shards) == [None if k is None else shard_of(k, shards) for k in keys[start:]]


def test_a_null_key_whose_slot_holds_bytes_has_no_interval() -> None:
    from headrace.engine.batch import shard_of

    offsets = pa.py_buffer(np.array([0, 2, 5, 6], dtype=np.int32).tobytes())
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little").tobytes())
    column = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, pa.py_buffer(b"abcdef")], null_count=1)
    assert column.to_pylist() == ["ab", None, "f"]
    assert _string_shards(column, 7) == [shard_of("ab", 7), None, shard_of("f", 7)]


def test_a_key_fields_intervals_are_its_keys_intervals() -> None:
    from headrace.engine.batch import shard_of

    values = [{"user": f"ü{i}", "n": i - 3} for i in range(7)]
    seg = segment_columns(encode_segment(typed(values), SCHEMA))
    assert seg.field_shards("user", str, 5) == [shard_of(v["user"], 5) for v in values]
    assert seg.field_shards("n", int, 5) == [shard_of(str(v["n"]), 5) for v in values]
    assert seg.field_shards("n", str, 5) is None and seg.field_shards("nope", str, 5) is None
    untyped = segment_columns(encode_segment(typed(values)))
    assert untyped.field_shards("user", str, 5) is None


FLAT = StreamSchema("user STRING, n BIGINT, score DOUBLE, ok BOOLEAN")
FLAT_VALUES = [{"user": "ada", "n": 3, "score": 0.5, "ok": True}, {"user": "bob", "n": -(2**63), "score": None, "ok": False},
               {"user": None, "n": 2**63 - 1, "score": float("inf"), "ok": None}]


def same(got: list[Any], expected: list[Any]) -> bool:
    """Equal, with each field's type and each dict's key order."""
    return [[(k, type(x), x) for k, x in v.items()] for v in got] == \
        [[(k, type(x), x) for k, x in v.items()] for v in expected]


def test_values_that_are_exactly_their_fields_are_built_from_the_field_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from headrace.store import segments

    data = encode_segment(typed(FLAT_VALUES), FLAT)

    def refuse(_: bytes) -> Any:
        raise AssertionError("a value was unpickled")

    monkeypatch.setattr(segments.pickle, "loads", refuse)
    assert same(segment_columns(data).values_at([2, 0]), [FLAT_VALUES[2], FLAT_VALUES[0]])
    assert same(segment_columns(data).values, FLAT_VALUES)
    table = segments.routed_table(decode_segment(data), [1, 2], ["b", None], [None, "no key"])
    assert same(segments.DecodedSegment(table).values, FLAT_VALUES[1:])  # a routed segment keeps the writer's word


@pytest.mark.parametrize("odd, why", [
    ({"n": 1, "user": "cy", "score": 0.5, "ok": True}, "its fields in another order than the schema's"),
    ({"user": "cy", "n": 1, "score": 0.5}, "a field missing (it would read back as None)"),
    ({"user": "cy", "n": 1, "score": 2, "ok": True}, "an int in a DOUBLE field (it would read back as 2.0)"),
    ({"user": "cy", "n": 1, "score": 0.5, "ok": np.bool_(True)}, "a numpy bool (it would read back as a bool)"),
    ({np.str_("user"): "cy", "n": 1, "score": 0.5, "ok": True}, "a str subclass key (it would read back as a str)"),
])
def test_values_that_are_not_exactly_their_fields_are_unpickled(odd: Any, why: str) -> None:
    values = [FLAT_VALUES[0], odd]
    data = encode_segment(typed(values), FLAT)
    seg = segment_columns(data)
    assert seg.fields_schema is not None and not seg._values_in_fields, why
    assert same(seg.values, values) and same(segment_columns(data).values_at([1]), [odd])


@pytest.mark.parametrize("ddl", ["user STRING, n BIGINT, score FLOAT", "user STRING, n BIGINT, tags ARRAY<STRING>"])
def test_a_schema_with_a_column_that_does_not_read_back_exactly_has_its_values_unpickled(ddl: str) -> None:
    values = [{"user": "ada", "n": 1, ddl.split()[-2].rstrip(","): 0.1 if "FLOAT" in ddl else ["a"]}]
    seg = segment_columns(encode_segment(typed(values), StreamSchema(ddl)))
    assert seg.fields_schema is not None and not seg._values_in_fields  # a FLOAT holds 0.1 as 0.10000000149...
    assert same(seg.values, values)


def test_produced_values_are_unpickled_as_produced_even_if_their_dict_changed_since() -> None:
    from headrace.engine.batch import produced

    out: dict[str, Any] = {"user": "ada", "n": 0, "score": 0.5, "ok": True}
    records = []
    for n in range(3):  # user code that reuses one dict for each production
        out["n"] = n
        records.append(produced("clicks", None, out, n, f"id{n}", pickle.dumps(out)))
    seg = segment_columns(encode_segment(records, FLAT))
    assert not seg._values_in_fields and [v["n"] for v in seg.values] == [0, 1, 2]
