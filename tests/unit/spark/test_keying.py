"""spark/keying.py: input rows become keyed rows bound to their shard's task; no SparkSession needed."""

from __future__ import annotations

import pickle
import re
from typing import Any

import pyarrow as pa
import pytest

from headrace import key_by
from headrace.engine import shard_of
from headrace.errors import BadInputError
from headrace.spark.keying import (CONTROL, KEYED_SCHEMA, PARTIAL, RECORD, REJECTED, Keying, partition_labels,
                                   spark_hash_int)
from headrace.spark.source import SOURCE_SCHEMA

from ...monoids import Adding

# Spark's own org.apache.spark.unsafe.hash.Murmur3_x86_32.hashInt(value, 42), run from the
# spark-unsafe jar PySpark ships (hashLong gives other values: hashLong(0, 42) is -1670924195).
SPARK_HASH_INT = {0: 933211791, 1: -559580957, 2: 1765031574, 3: -1823081949, 42: 29417773,
                  -1: -1604776387, 2**31 - 1: 133916647, -(2**31): 723455942}

USERS = ["ana", "bo", "cy", "dee", "eli", "fay"]


def source_rows(*rows: dict[str, Any]) -> pa.RecordBatch:
    """Rows as the source emits them; a record row is given by its stream, value and id."""
    full: dict[str, list[Any]] = {name: [] for name in SOURCE_SCHEMA.names}
    for row in rows:
        if row.get("kind") == CONTROL:
            filled = {"kind": CONTROL, "stream": None, "key": None, "value": None, "timestamp": 0, "id": None,
                      "wm_before": row["wm_before"], "wm_after": row["wm_after"], "wall": row["wall"]}
        else:
            value = row["raw"] if "raw" in row else pickle.dumps(row["value"])
            filled = {"kind": RECORD, "stream": row["stream"], "key": None, "value": value,
                      "timestamp": row.get("timestamp", 0), "id": row["id"], "wm_before": 0, "wm_after": 0, "wall": 0}
        for name in SOURCE_SCHEMA.names:
            full[name].append(filled[name])
    return pa.RecordBatch.from_pydict(full, schema=SOURCE_SCHEMA)


def control(wm_before: int = 100, wm_after: int = 200, wall: int = 300) -> dict[str, Any]:
    return {"kind": CONTROL, "wm_before": wm_before, "wm_after": wm_after, "wall": wall}


def record(user: Any, n: int, stream: str = "events") -> dict[str, Any]:
    return {"stream": stream, "value": {"user": user, "n": n}, "timestamp": 1000 + n, "id": f"e-{n}"}


def keying(shards: int = 4, dead_letters: bool = False) -> Keying:
    return Keying("Counter", {"events": key_by("user"), "clicks": key_by(lambda v: v["user"].upper())}, shards,
                  dead_letters)


def test_a_control_row_fans_out_to_one_row_per_shard() -> None:
    k = keying(shards=4)
    out = k.apply(source_rows(control(wm_before=-5, wm_after=70, wall=1234)))
    assert out.schema == KEYED_SCHEMA
    rows = out.to_pylist()
    assert [r["shard"] for r in rows] == [0, 1, 2, 3]
    assert [r["part"] for r in rows] == [k.labels[s] for s in range(4)]
    for r in rows:
        assert (r["kind"], r["key"], r["wm_before"], r["wm_after"], r["wall"]) == (CONTROL, None, -5, 70, 1234)


def test_records_get_the_consumers_key_shard_and_partition_label() -> None:
    k = keying(shards=4)
    given = [record(user, n) for n, user in enumerate(USERS)] + [record("gus", 99, stream="clicks")]
    rows = k.apply(source_rows(*given)).to_pylist()
    expected_keys = USERS + ["GUS"]
    assert [r["key"] for r in rows] == expected_keys
    assert [r["shard"] for r in rows] == [shard_of(key, 4) for key in expected_keys]
    assert [r["part"] for r in rows] == [k.labels[shard_of(key, 4)] for key in expected_keys]
    assert [r["kind"] for r in rows] == [RECORD] * len(given)
    assert [pickle.loads(r["value"]) for r in rows] == [g["value"] for g in given]
    assert [(r["stream"], r["timestamp"], r["id"]) for r in rows] == [
        (g["stream"], g["timestamp"], g["id"]) for g in given]


def test_the_keys_spread_over_more_than_one_shard() -> None:
    """Guards the test above: with one shard for every key it would prove nothing about sharding."""
    assert len({shard_of(user, 4) for user in USERS}) > 1


def test_a_record_whose_key_cannot_be_extracted_fails_the_batch() -> None:
    bad = {"stream": "events", "value": {"name": "no user"}, "id": "e-7"}
    with pytest.raises(BadInputError, match="^" + re.escape(
            "Computation 'Counter' cannot take record 'e-7' of stream 'events': failed extracting its key with "
            "key_by('user') (got InvalidKeyError: key_by('user') found no field 'user' in the record "
            "(got {'name': 'no user'}). Hint: check the field name, or pass a function: key_by(lambda v: ...)). "
            "Hint: fix the record or the key extractor, or add the computation with on_error='dead_letter' to "
            "route such records aside") + "$"):
        keying().apply(source_rows(record("ana", 1), bad))


def test_a_record_that_cannot_be_decoded_fails_the_batch() -> None:
    bad = {"stream": "events", "raw": b"not a pickle", "id": "e-8"}
    with pytest.raises(BadInputError, match="^" + re.escape(
            "Computation 'Counter' cannot take record 'e-8' of stream 'events': failed decoding it "
            "(got UnpicklingError: invalid load key, 'n'.). "
            "Hint: fix the record or the key extractor, or add the computation with on_error='dead_letter' to "
            "route such records aside") + "$"):
        keying().apply(source_rows(bad))


def test_with_dead_letters_a_bad_record_becomes_a_rejected_row_on_shard_0() -> None:
    k = keying(shards=4, dead_letters=True)
    bad_value = pickle.dumps({"user": 42})
    bad = {"stream": "clicks", "raw": bad_value, "id": "c-1"}
    rows = k.apply(source_rows(control(), record("ana", 1), bad, record("bo", 2))).to_pylist()

    assert [r["kind"] for r in rows] == [CONTROL] * 4 + [RECORD, REJECTED, RECORD]
    rejected = rows[5]
    assert (rejected["stream"], rejected["key"], rejected["id"], rejected["shard"], rejected["part"]) == (
        "clicks", "", "c-1", 0, k.labels[0])
    assert pickle.loads(rejected["value"]) == {
        "computation": "Counter", "key": None, "at": "failed extracting its key with key_by(keying.<locals>.<lambda>)",
        "stream": "clicks", "record_id": "c-1", "value": bad_value,
        "error": "AttributeError: 'int' object has no attribute 'upper'"}

    good = [rows[4], rows[6]]
    assert [(r["key"], r["shard"], r["id"]) for r in good] == [("ana", shard_of("ana", 4), "e-1"),
                                                               ("bo", shard_of("bo", 4), "e-2")]
    assert [pickle.loads(r["value"]) for r in good] == [{"user": "ana", "n": 1}, {"user": "bo", "n": 2}]
    assert [r["shard"] for r in rows[:4]] == [0, 1, 2, 3]


def test_the_option_text_round_trips() -> None:
    k = keying(shards=3, dead_letters=True)
    back = Keying.from_option(k.to_option())
    assert (back.computation, back.shards, back.dead_letters, back.labels) == ("Counter", 3, True, k.labels)
    assert sorted(back.extractors) == ["clicks", "events"]
    batch = source_rows(control(), record("ana", 1), record("bo", 2, stream="clicks"))
    assert back.apply(batch).to_pylist() == k.apply(batch).to_pylist()


@pytest.mark.parametrize("value, expected", sorted(SPARK_HASH_INT.items()))
def test_spark_hash_int_matches_sparks_murmur3(value: int, expected: int) -> None:
    assert spark_hash_int(value) == expected


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7, 8, 16, 33, 64])
def test_partition_labels_send_each_shard_alone_to_its_own_partition(shards: int) -> None:
    labels = partition_labels(shards)
    assert len(labels) == shards
    # Python's % is Spark's pmod for a positive divisor
    assert [spark_hash_int(label) % shards for label in labels] == list(range(shards))
    for partition, label in enumerate(labels):
        smaller = [x for x in range(label) if spark_hash_int(x) % shards == partition]
        assert smaller == [], f"label {label} of partition {partition} is not the first integer that lands there"


def test_partition_labels_of_four_shards() -> None:
    """Also derived from Spark's Murmur3_x86_32.hashInt with Math.floorMod (Spark's pmod)."""
    assert partition_labels(4) == [12, 6, 2, 0]


class CountPerUser(Adding):
    def window(self, record: Any) -> int:
        return record.timestamp - record.timestamp % 10 + 10

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("counts", aggregate)


def test_a_monoid_read_folds_its_records_into_one_row_per_key_and_window() -> None:
    k = Keying("Counter", {"events": key_by("user"), "clicks": key_by("user")}, 4, False, CountPerUser(),
               frozenset({"events"}))  # clicks: ids checked, so never folded
    folder = k.folder(watermark_before=1003)
    rows = [record(u, n) for n, u in enumerate(USERS * 3)]  # timestamps 1000..1017: ana 1000, 1006, 1012, ...
    out = k.apply(source_rows(*rows, record("ana", 40, stream="clicks")), folder).to_pylist()
    late = [r["id"] for r in rows if r["timestamp"] < 1003]
    assert [r["id"] for r in out] == [*late, "e-40"]  # late records and the checked stream travel alone
    assert {r["kind"] for r in out} == {RECORD}
    partials = k.partial_rows(folder).to_pylist()
    assert all(p["kind"] == PARTIAL and p["shard"] == shard_of(p["key"], 4) for p in partials)
    folded = {(p["key"], p["timestamp"]): pickle.loads(p["value"]) for p in partials}
    expected: dict[tuple[str, int], int] = {}
    for r in rows:
        if r["timestamp"] >= 1003:
            w = (r["value"]["user"], r["timestamp"] - r["timestamp"] % 10 + 10)
            expected[w] = expected.get(w, 0) + 1
    assert folded == {w: (n, n) for w, n in expected.items()}  # (aggregate, records)
    assert Keying("Plain", {"events": key_by("user")}, 4).folder(0) is None
