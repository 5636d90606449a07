"""Stream schemas: Spark DDL or pyarrow in, the same Arrow schema out; values checked with a reason."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest

from headrace import Computation, Topology, key_by
from headrace.errors import OptionError, SchemaMismatchError, TopologyError, UserCodeError
from headrace.schema import StreamSchema
from headrace.testing import Harness


def exact(text: str) -> str:
    return "^" + re.escape(text) + "$"


def test_a_ddl_string_and_a_pyarrow_schema_give_the_same_schema() -> None:
    parsed = StreamSchema("user STRING, n: bigint, ok BOOLEAN, tags ARRAY<STRING>, at STRUCT<x: DOUBLE, y INT> NOT NULL")
    given = StreamSchema(pa.schema([("user", pa.string()), ("n", pa.int64()), ("ok", pa.bool_()),
                                    ("tags", pa.list_(pa.string())),
                                    pa.field("at", pa.struct([("x", pa.float64()), ("y", pa.int32())]), nullable=False)]))
    assert parsed == given
    assert parsed.ddl == "`user` STRING, `n` BIGINT, `ok` BOOLEAN, `tags` ARRAY<STRING>, `at` STRUCT<`x`: DOUBLE, `y`: INT>"
    assert StreamSchema(parsed.ddl).arrow.equals(pa.schema([f.with_nullable(True) for f in parsed.arrow]))


def test_a_value_that_does_not_fit_gets_the_reason() -> None:
    schema = StreamSchema("user STRING NOT NULL, n BIGINT")
    assert schema.check({"user": "ann", "n": 3}) is None
    assert schema.check({"user": "ann"}) is None  # a nullable field may be missing
    assert schema.check(["ann", 3]) == "a value of a typed stream is a dict of its fields, not list"
    assert schema.check({"user": "ann", "m": 1}) == "field 'm' is not in the schema (`user` STRING, `n` BIGINT)"
    assert schema.check({"n": 1}) == "field 'user' is NOT NULL but missing"
    reason = schema.check({"user": "ann", "n": "three"})
    assert reason is not None and reason.startswith("ArrowInvalid: Could not convert 'three'")
    with pytest.raises(SchemaMismatchError, match=exact(
            "A value produced to typed stream 'counts' does not fit its schema: field 'm' is not in the schema "
            "(`user` STRING, `n` BIGINT) (got {'user': 'ann', 'm': 1}). Hint: produce a dict with the fields "
            "`user` STRING, `n` BIGINT")):
        schema.require("counts", {"user": "ann", "m": 1})


def test_a_bad_schema_is_refused_where_it_is_written() -> None:
    with pytest.raises(OptionError, match=exact(
            "A stream schema must be a Spark DDL string; expected a type (bigint, binary, boolean, date, double, "
            "float, int, smallint, string, timestamp, tinyint, array, map or struct) at 'strin' (got 'user strin'). "
            "Hint: e.g. schema='user STRING, n BIGINT, tags ARRAY<STRING>'")):
        StreamSchema("user strin")
    with pytest.raises(OptionError, match=exact(
            "A stream schema is a Spark DDL string or a pyarrow.Schema (got {'n': 'bigint'}). "
            "Hint: e.g. schema='user STRING, n BIGINT'")):
        StreamSchema({"n": "bigint"})  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=exact(
            "A stream schema may use Spark SQL's types only (got 'uint64'). Hint: use one of ['BIGINT', 'BINARY', "
            "'BOOLEAN', 'DATE', 'DOUBLE', 'FLOAT', 'INT', 'SMALLINT', 'STRING', 'TIMESTAMP', 'TINYINT'], ARRAY, "
            "MAP or STRUCT")):
        StreamSchema(pa.schema([("n", pa.uint64())]))


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("out", record.value)


def test_a_topology_types_only_a_stream_it_has() -> None:
    t = Topology("typed")
    t.inject("words", [{"w": "a"}])
    with pytest.raises(TopologyError, match=exact(
            "Topology 'typed' cannot declare stream 'out': nothing produces it (got 'out'). Hint: inject it or add its "
            "producer first; known streams are ['words']")):
        t.stream("out", schema="w STRING")
    t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"])
    assert t.stream("out", schema="w STRING") == StreamSchema("w STRING")
    assert t.schemas_of(["out", "words"]) == {"out": StreamSchema("w STRING")}


class CountPerKey(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def test_an_injected_value_that_does_not_fit_is_dead_lettered_on_the_harness_with_the_reason() -> None:
    h = Harness(CountPerKey, schemas={"input": "user STRING, n BIGINT"}, on_error="dead_letter")
    h.process("ann", {"user": "ann", "n": 1}, 10)
    h.process("ann", {"user": "ann", "n": "two"}, 20, id="r2")
    h.process("ann", ["ann", 3], 30, id="r3")
    assert h.state("ann") == 1
    assert h.counters["dead_lettered"] == 2
    letters = [r.value for r in h.productions("CountPerKey.dead_letter")]
    assert [(v["record_id"], v["stream"], v["value"]) for v in letters] == [
        ("r2", "input", {"user": "ann", "n": "two"}), ("r3", "input", ["ann", 3])]
    assert letters[1]["error"] == (
        "SchemaMismatchError: A value produced to typed stream 'input' does not fit its schema: a value of a typed "
        "stream is a dict of its fields, not list (got ['ann', 3]). Hint: produce a dict with the fields "
        "`user` STRING, `n` BIGINT")
    assert letters[0]["error"].startswith("SchemaMismatchError: A value produced to typed stream 'input' does not "
                                          "fit its schema: ArrowInvalid: Could not convert 'two'")


def test_without_dead_letters_an_injected_misfit_fails_naming_the_record() -> None:
    h = Harness(CountPerKey, schemas={"input": "n BIGINT"})
    with pytest.raises(UserCodeError, match=re.escape(
            "Computation 'CountPerKey' failed on key 'k' at record 'r1' (timestamp 5): A value produced to typed "
            "stream 'input' does not fit its schema: field 'm' is not in the schema (`n` BIGINT)")):
        h.process("k", {"m": 1}, 5, id="r1")
    with pytest.raises(OptionError, match=exact(
            "Harness schemas are a dict of stream name to schema (got ['input']). Hint: e.g. "
            "schemas={'input': 'user STRING, n BIGINT'}")):
        Harness(CountPerKey, schemas=["input"])  # type: ignore[arg-type]


def test_a_computation_checks_its_outputs_and_its_injected_inputs() -> None:
    t = Topology("checked")
    t.inject("events", [{"n": 1}])
    t.add(CountPerKey, name="First", inputs={"events": key_by("n")}, outputs=["mid"])
    t.add(CountPerKey, name="Second", inputs={"mid": key_by("n")}, outputs=["out"])
    for stream in ("events", "mid", "out"):
        t.stream(stream, schema="n BIGINT")
    assert sorted(t.checked_schemas("First")) == ["events", "mid"]
    assert sorted(t.checked_schemas("Second")) == ["out"]  # "mid" was checked when First produced it


def test_the_misfits_of_many_values_are_those_check_refuses() -> None:
    """``misfits`` converts a column at once when every value fits, and otherwise names exactly the
    positions ``check`` refuses (what a monoid's read leaves out of its fold)."""
    schema = StreamSchema("user STRING NOT NULL, n BIGINT")
    good = [{"user": "ann", "n": 1}, {"user": "bob"}, {"user": "cy", "n": None}]
    assert schema.misfits(good) == [] and schema.misfits([]) == []
    values = [*good, {"user": "dee", "n": "two"}, ["eve", 3], {"user": "fay", "x": 1}, {"n": 4}, {"user": "gus", "n": 5}]
    assert schema.misfits(values) == [i for i, v in enumerate(values) if schema.check(v) is not None] == [3, 4, 5, 6]


def test_when_the_column_check_raises_each_value_is_checked_on_its_own() -> None:
    h = Harness(CountPerKey, schemas={"input": "n BIGINT"}, on_error="dead_letter")

    def raising(values: Any) -> list[int]:
        raise RuntimeError("a conversion that raised outside Arrow's errors")

    h.schemas["input"].misfits = raising  # type: ignore[method-assign]
    h.process("k", {"n": 1}, 5, id="r1")
    h.process("k", {"m": 1}, 6, id="r2")
    assert h.state("k") == 1  # the one that fits was processed, the misfit dead-lettered with its reason
    assert [(v["record_id"], v["error"]) for v in (r.value for r in h.productions("CountPerKey.dead_letter"))] == [
        ("r2", "SchemaMismatchError: A value produced to typed stream 'input' does not fit its schema: field 'm' is "
               "not in the schema (`n` BIGINT) (got {'m': 1}). Hint: produce a dict with the fields `n` BIGINT")]
