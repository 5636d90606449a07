"""A segment (one producer's records on one stream for one batch) is an Arrow IPC stream.

Values are pickled one by one, so readers can pass them on untouched.
"""

from __future__ import annotations

import pickle

import pyarrow as pa

from ..engine.batch import Production
from ..engine.ports import SegmentColumns

__all__ = ["SEGMENT_SCHEMA", "encode_segment", "decode_segment", "segment_rows", "segment_columns"]

SEGMENT_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary()), ("timestamp", pa.int64()), ("id", pa.string())])


def encode_segment(records: list[Production]) -> bytes:
    dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
    table = pa.table({
        "key": pa.array([p.key for p in records], pa.string()),
        "value": pa.array([dumps(p.value, proto) for p in records], pa.binary()),
        "timestamp": pa.array([p.timestamp for p in records], pa.int64()),
        "id": pa.array([p.id for p in records], pa.string()),
    }, schema=SEGMENT_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SEGMENT_SCHEMA) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_segment(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def segment_columns(data: bytes) -> SegmentColumns:
    """The segment's columns as lists, values unpickled: a reader that loops over columns makes
    no tuple per record."""
    t = decode_segment(data)
    return SegmentColumns(t.column("key").to_pylist(), list(map(pickle.loads, t.column("value").to_pylist())),
                          t.column("timestamp").to_pylist(), t.column("id").to_pylist())


def segment_rows(data: bytes) -> list[tuple]:
    """(key, value, timestamp, id) per record, values unpickled."""
    return list(zip(*segment_columns(data)))
