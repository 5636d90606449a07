"""The DataFrame view's reader (``spark/frames.py``) without a SparkSession: a typed stream's values
come from the segment's ``fields`` column when its writer kept one, unpickling nothing, and equal
what converting the unpickled values gives (tests/spark/test_frames.py reads them through Spark)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.engine.batch import Production
from headrace.schema import StreamSchema
from headrace.spark import frames
from headrace.store import open_store

SCHEMA = StreamSchema("user STRING, n BIGINT, tags ARRAY<STRING>, score DOUBLE, seen TIMESTAMP")
VALUES: list[dict[str, Any]] = [
    {"user": "ann", "n": 1, "tags": ["a", "b"], "score": 0.5, "seen": None},
    {"user": "bob", "n": None, "tags": [], "score": 2.0},
    {"user": "cy", "n": -(2**63), "tags": None, "score": float("inf"), "seen": None},
    {"user": "dee", "n": 2**63 - 1, "score": -0.0},
]


class CountingPickle:
    """Stands in for the ``pickle`` module in ``spark/frames.py``: counts the values it unpickles."""

    def __init__(self) -> None:
        self.loaded = 0

    def loads(self, data: bytes) -> Any:
        self.loaded += 1
        return pickle.loads(data)


def publish(url: str, batch: int, values: list[Any], typed_segment: bool) -> None:
    store = open_store(url)
    records = [Production("s", v.get("user"), v, 1_000 * batch + i, f"{batch}-{i}") for i, v in enumerate(values)]
    store.publish("inject:s", batch, {"s": records}, 0, schemas={"s": SCHEMA} if typed_segment else None)
    store.close()


def read_batch(url: str, batch: int) -> pa.Table:
    """What the DataFrame view's read tasks yield for ``batch`` of the typed stream ``s``."""
    reader = frames.BatchFrameReader({"store": url, "stream": "s", "value_ddl": SCHEMA.ddl})
    part = frames.ProducerRange("inject:s", batch - 1, batch)
    return pa.Table.from_batches(list(reader.read(part)))


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingPickle:
    counter = CountingPickle()
    monkeypatch.setattr(frames, "pickle", counter)
    return counter


def test_a_typed_segment_is_read_from_its_field_columns_and_equals_the_unpickled_values(
        tmp_path: Path, counting: CountingPickle) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    publish(url, 1, VALUES, typed_segment=True)  # an injector's segment: the values and their field columns
    publish(url, 2, VALUES, typed_segment=False)  # the same values, pickled only

    from_fields = read_batch(url, 1)
    assert counting.loaded == 0
    from_values = read_batch(url, 2)
    assert counting.loaded == len(VALUES)

    expected = SCHEMA.values(VALUES)
    for table in (from_fields, from_values):
        assert table.schema.field("value").type == SCHEMA.struct
        assert table.column("value").combine_chunks().equals(expected)
        assert table.column("value").to_pylist() == expected.to_pylist()
    assert from_fields.drop_columns(["batch", "id", "timestamp"]).equals(from_values.drop_columns(
        ["batch", "id", "timestamp"]))


def test_a_segment_without_exact_field_columns_is_converted_value_by_value_a_misfit_as_null(
        tmp_path: Path, counting: CountingPickle) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    # a misfit (a str in a BIGINT field) and a 3.0 that BIGINT reads as 3: the writer keeps no field columns
    values = [VALUES[0], {"user": "eve", "n": "three"}, {"user": "fay", "n": 3.0}]
    publish(url, 1, values, typed_segment=True)

    table = read_batch(url, 1)
    assert counting.loaded == 3
    assert [v if v is None else (v["user"], v["n"]) for v in table.column("value").to_pylist()] == [
        ("ann", 1), None, ("fay", 3)]


def test_a_segment_typed_under_another_schema_is_converted_under_the_readers(tmp_path: Path,
                                                                           counting: CountingPickle) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(url)
    older = StreamSchema("user STRING, n BIGINT")  # the stream's schema when this segment was written
    store.publish("inject:s", 1, {"s": [Production("s", "ann", {"user": "ann", "n": 7}, 1_000, "1-0")]}, 0,
                  schemas={"s": older})
    store.close()

    table = read_batch(url, 1)
    assert counting.loaded == 1
    assert table.column("value").to_pylist() == [{"user": "ann", "n": 7, "tags": None, "score": None, "seen": None}]
