"""A segment (one producer's records on one stream for one batch) is an Arrow IPC stream.

Values are pickled one by one, so readers can pass them on untouched. A typed stream's segment
may also keep its values' fields as one struct column, ``fields``: a reader that needs a field or
two of every record (a monoid's fold, §3.13) reads those columns and unpickles nothing. When every
value is exactly its fields (``values_are_fields``), the writer says so in the schema's metadata,
and a reader builds the values from that column (three times as fast as unpickling them here).
"""

from __future__ import annotations

import os
import pickle
from itertools import chain
from operator import itemgetter
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..engine.batch import Produced, Production
from ..engine.keyhash import shards_of_column
from ..errors import OptionError
from ..model import END_OF_TIME
from ..schema import StreamSchema

__all__ = ["SEGMENT_SCHEMA", "PIECE_SLOT", "segment_limit", "pieces", "encode_segment", "segment_table", "routed_table", "to_bytes", "decode_segment", "segment_rows", "segment_columns", "DecodedSegment"]

SEGMENT_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary()), ("timestamp", pa.int64()), ("id", pa.string())])
FIELDS = "fields"
ERROR = "error"  # a routed segment's reason a record has no key (None where it has one)
_SCHEMA_KEY = b"headrace.fields"  # the field columns' schema (its fingerprint), in the Arrow schema's metadata
_VALUES_KEY = b"headrace.values"  # b"fields": each value is exactly its row of the field columns

# A segment larger than the limit is stored as pieces, piece i at slot ``slot + i * PIECE_SLOT``
# (slots below it: a shard, plus weak resends at ``k * WEAK_SLOT``), read back in slot order:
# SQLite's and PostgreSQL's blobs stop at 1 GB, and a batch past it could never commit.
PIECE_SLOT = 1 << 40
DEFAULT_SEGMENT_LIMIT = 256 << 20
SEGMENT_LIMIT_ENV = "HEADRACE_SEGMENT_BYTES"


def segment_limit() -> int:
    """The largest segment stored whole, in bytes: ``HEADRACE_SEGMENT_BYTES``, else 256 MiB."""
    value = os.environ.get(SEGMENT_LIMIT_ENV, "")
    if not value:
        return DEFAULT_SEGMENT_LIMIT
    if not value.isdigit() or int(value) < 1:
        raise OptionError(f"{SEGMENT_LIMIT_ENV} must be a whole number of bytes >= 1", got=value,
                          hint=f"e.g. {SEGMENT_LIMIT_ENV}=268435456 (256 MiB, the default); leave it unset for that")
    return int(value)


def pieces(table: pa.Table, limit: int) -> list[tuple[int, bytes]]:
    """``table`` as segments of at most ``limit`` bytes each (a single record larger than that is
    one piece of its own), in order, each with its row count."""
    data = to_bytes(table)
    if len(data) <= limit or table.num_rows <= 1:
        return [(table.num_rows, data)]
    parts = min(table.num_rows, -(-len(data) // limit))
    step = -(-table.num_rows // parts)
    return [p for at in range(0, table.num_rows, step) for p in pieces(table.slice(at, step), limit)]


def encode_segment(records: list[Production], schema: StreamSchema | None = None) -> bytes:
    """The records as a segment; with the ``schema`` of their typed stream, also their fields as
    columns, when every value fits it exactly (``exact_fields``)."""
    return to_bytes(segment_table(records, schema))


def segment_table(records: Sequence[Production], schema: StreamSchema | None = None) -> pa.Table:
    """A stream's segment as a table (each value pickled once): ``to_bytes`` stores it, and
    ``routed_table`` takes a consumer interval's rows of it."""
    dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
    columns = {
        "key": pa.array([p.key for p in records], pa.string()),
        "value": pa.array([p.raw if type(p) is Produced else dumps(p.value, proto) for p in records], pa.binary()),
        "timestamp": pa.array([p.timestamp for p in records], pa.int64()),
        "id": pa.array([p.id for p in records], pa.string()),
    }
    arrow_schema = SEGMENT_SCHEMA
    values = [p.value for p in records] if schema is not None and records else []
    fields = exact_fields(values, schema) if schema is not None and values else None
    if schema is not None and fields is not None:
        columns[FIELDS] = fields
        meta = {_SCHEMA_KEY: schema.fingerprint.encode()}
        # a Produced value was pickled when produced: its dict may have changed since (reused by user code)
        if not any(type(p) is Produced for p in records) and values_are_fields(values, schema):
            meta[_VALUES_KEY] = FIELDS.encode()
        arrow_schema = SEGMENT_SCHEMA.append(pa.field(FIELDS, fields.type)).with_metadata(meta)
    return pa.table(columns, schema=arrow_schema)


def routed_table(table: pa.Table, rows: Sequence[int], keys: Sequence[str | None],
                 errors: Sequence[str | None] | None) -> pa.Table:
    """The rows of a stream's segment that go to one consumer interval, each with the consumer's
    key (``key``), and, where some record has no key, an ``error`` column saying why."""
    picked = table.take(pa.array(rows, pa.int64())).set_column(0, "key", pa.array(keys, pa.string()))
    if errors is not None:
        picked = picked.append_column(ERROR, pa.array(errors, pa.string()))
    return picked


def to_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def exact_fields(values: Sequence[Any], schema: StreamSchema) -> pa.StructArray | None:
    """The values' fields as one struct column, when each value is a plain ``dict`` that fits
    ``schema`` and each of its
    integer and string fields holds exactly a Python ``int`` or ``str``: a reader of these columns
    then sees what a reader of the unpickled values sees (a ``3.0`` in a BIGINT field would read
    back as ``3``, and so leaves the segment without field columns)."""
    if not all(type(v) is dict for v in values):  # a dict subclass may read its fields otherwise
        return None
    column = schema.column(values)
    if column is None:
        return None
    for f in schema.arrow:
        exact = _exact_kind(f.type)
        if exact in _CHECKED_BY_EXACT_FIELDS and \
                not all(type(v[f.name]) is exact for v in values if v.get(f.name) is not None):
            return None
    return column


def values_are_fields(values: Sequence[dict[str, Any]], schema: StreamSchema) -> bool:
    """Whether each value is exactly its row of the field columns: every field of ``schema``
    present, in its order, and nothing else, each one None or exactly the Python type its column
    reads back as (``int``, ``str``, ``bool``, or a ``float`` in a DOUBLE; no other column type):
    that row, read back, equals the unpickled value, type for type. Only for values that
    ``exact_fields`` kept: their int and str fields are not checked again here."""
    names = tuple(f.name for f in schema.arrow)
    kinds = [_exact_kind(f.type) for f in schema.arrow]
    if any(k is None for k in kinds) or not all(map(names.__eq__, map(tuple, values))) or \
            not set(map(type, chain.from_iterable(values))) <= {str}:  # a str subclass key would come back a str
        return False
    # ints and strs were checked exact by exact_fields; a bool or float column also takes other types
    return all(set(map(type, map(itemgetter(name), values))) <= {kind, type(None)}
               for name, kind in zip(names, kinds) if kind not in _CHECKED_BY_EXACT_FIELDS)


# A field's Arrow type -> the one Python type whose values read back from it unchanged.
_EXACT_KINDS = ((pa.types.is_integer, int), (pa.types.is_string, str), (pa.types.is_boolean, bool),
                (pa.types.is_float64, float))
_CHECKED_BY_EXACT_FIELDS = (int, str)  # also the kinds a key is read as from a field column (_KINDS)


def _exact_kind(arrow_type: pa.DataType) -> type | None:
    return next((kind for test, kind in _EXACT_KINDS if test(arrow_type)), None)


def decode_segment(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


class DecodedSegment:
    """A segment's columns as lists (``engine.ports.SegmentColumns``): values decoded on first
    use, or only at the rows asked for (unpickled, or built from the field columns when the writer
    said they are exactly the values); a typed stream's fields read as columns without them."""

    __slots__ = ("fields_schema", "_table", "_timestamps", "_keys", "_ids", "_values", "_fields", "_key_columns",
                 "_values_in_fields")

    @property
    def errors(self) -> list[str | None] | None:
        """A routed segment's reasons its records have no key (None where one has), or None."""
        return self._table.column(ERROR).to_pylist() if ERROR in self._table.schema.names else None

    @property
    def raw_values(self) -> list[bytes]:
        """The values as stored (pickled), for a reader that passes them on undecoded."""
        return self._table.column("value").to_pylist()

    @property
    def table(self) -> pa.Table:
        return self._table

    def __init__(self, table: pa.Table):
        self._table = table
        self._timestamps: list[int] | None = None
        self._keys: list[str | None] | None = None
        self._ids: list[str] | None = None
        meta = table.schema.metadata or {}
        self.fields_schema: str | None = (meta[_SCHEMA_KEY].decode()
                                          if FIELDS in table.schema.names and _SCHEMA_KEY in meta else None)
        self._values_in_fields = self.fields_schema is not None and meta.get(_VALUES_KEY) == FIELDS.encode()
        self._values: list[Any] | None = None
        self._fields: dict[tuple[str, type], list[Any] | None] = {}
        self._key_columns: dict[tuple[str, type], pa.Array | None] = {}

    @property
    def timestamps(self) -> list[int]:  # a fold of totals (``field_totals``) never reads them as a list
        if self._timestamps is None:
            self._timestamps = self._table.column("timestamp").to_pylist()
        return self._timestamps

    @property
    def keys(self) -> list[str | None]:  # the producers' key hints: a fold from field columns never reads them
        if self._keys is None:
            self._keys = self._table.column("key").to_pylist()
        return self._keys

    @property
    def ids(self) -> list[str]:  # read by a fold from field columns only for its late records
        if self._ids is None:
            self._ids = self._table.column("id").to_pylist()
        return self._ids

    @property
    def values(self) -> list[Any]:
        if self._values is None:
            self._values = (self._table.column(FIELDS).to_pylist() if self._values_in_fields else
                            list(map(pickle.loads, self._table.column("value").to_pylist())))
        return self._values

    def values_at(self, rows: Sequence[int]) -> list[Any]:
        if self._values is not None:
            return [self._values[i] for i in rows]
        taken = self._table.column(FIELDS if self._values_in_fields else "value").take(pa.array(rows, pa.int64()))
        return taken.to_pylist() if self._values_in_fields else list(map(pickle.loads, taken.to_pylist()))

    def field(self, name: str, kind: type) -> list[Any] | None:
        """Field ``name`` of every value, when the writer kept the fields as columns and that field
        holds a ``kind`` (``int`` or ``str``) in every value; else None. Exact: ``exact_fields``."""
        if (name, kind) not in self._fields:
            is_kind = _KINDS.get(kind)
            column = (self._key_column(name, str) if kind is str else
                      _field_column(self._table.column(FIELDS).combine_chunks(), name, is_kind)
                      if self.fields_schema is not None and is_kind is not None else None)
            self._fields[(name, kind)] = column.to_pylist() if column is not None else None
        return self._fields[(name, kind)]

    def key_field(self, name: str, kind: type) -> list[str] | None:
        """Field ``name`` of every value as a key (``key_by(name)``: a str field as it is;
        ``key_by(name, int)``: an int field's decimal text, converted in Arrow), when the writer kept
        the fields as columns and the field holds a ``kind`` in every value; else None."""
        if kind is str:
            return self.field(name, str)
        column = self._key_column(name, kind)
        return column.to_pylist() if column is not None else None

    def field_shards(self, name: str, kind: type, shards: int) -> list[int | None] | None:
        """``shard_of`` each record's ``key_field`` key, hashed in columns; None when it is."""
        column = self._key_column(name, kind)
        return _string_shards(column, shards) if column is not None else None

    def key_shards(self, shards: int) -> list[int | None]:
        """``shard_of`` each record's stored key (None: no key), hashed in columns."""
        return _string_shards(self._table.column("key").combine_chunks(), shards)

    def _key_column(self, name: str, kind: type) -> pa.Array | None:
        """Field ``name`` as ``key_by(name, kind)``'s keys, an Arrow string column (kept for the
        segment: ``key_field`` and ``field_shards`` read the same one)."""
        if self.fields_schema is None or kind not in (int, str):
            return None
        if (name, kind) not in self._key_columns:
            column = _field_column(self._table.column(FIELDS).combine_chunks(), name, _KINDS[kind])
            self._key_columns[(name, kind)] = (pc.cast(column, pa.string()) if column is not None and kind is int
                                               else column)
        return self._key_columns[(name, kind)]

    def field_totals(self, key: str, part: str | None, window: int | None,
                     since: int) -> dict[tuple[str, int], tuple[int, int]] | None:
        """Per (field ``key``, window end): the sum of int field ``part`` (0 when None) and the
        number of records, summed in Arrow; a record's window ends at ``ts - ts % window + window``
        (one window, ``END_OF_TIME``, when ``window`` is None). None, and nothing summed, unless
        every record is at or after ``since``, ``key`` holds a ``str`` and ``part`` an ``int`` in
        every value (as ``field`` reads them), and no sum or window end can leave 64 bits: the
        caller then folds the lists, a record at a time, with the same result."""
        if self.fields_schema is None or len(self) == 0:
            return None
        struct = self._table.column(FIELDS).combine_chunks()
        keys = _field_column(struct, key, _KINDS[str])
        parts = _field_column(struct, part, _KINDS[int]) if part is not None else None
        stamps = self._table.column("timestamp")
        low, high = pc.min_max(stamps).values()
        if keys is None or (part is not None and parts is None) or low.as_py() < since:
            return None
        try:
            columns = {"key": keys}
            if window is not None:  # floor division is truncation for the non-negative
                if low.as_py() < 0:
                    return None
                columns["end"] = pc.add_checked(pc.multiply_checked(pc.divide(stamps, window), window), window)
            if parts is not None:
                lo, hi = (v.as_py() for v in pc.min_max(parts).values())
                if max(abs(lo), abs(hi)) * len(parts) >= 1 << 63:
                    return None
                columns["part"] = pc.cast(parts, pa.int64())
        except pa.ArrowInvalid:  # a window end past 64 bits
            return None
        groups = ["key", "end"] if window is not None else ["key"]
        summed = pa.table(columns).group_by(groups).aggregate(
            [("part", "sum"), ("part", "count")] if parts is not None else [("key", "count")])
        ends = summed.column("end").to_pylist() if window is not None else None
        totals = (summed.column("part_sum").to_pylist() if parts is not None
                  else [0] * summed.num_rows)
        counts = summed.column("part_count" if parts is not None else "key_count").to_pylist()
        names = summed.column("key").to_pylist()
        return {(k, ends[i] if ends is not None else END_OF_TIME): (totals[i], counts[i])
                for i, k in enumerate(names)}

    def __len__(self) -> int:
        return self._table.num_rows


# a key's kinds -> the Arrow types it is read from
_KINDS: dict[type, Any] = {kind: test for test, kind in _EXACT_KINDS if kind in _CHECKED_BY_EXACT_FIELDS}


def _field_column(struct: pa.StructArray, name: str, is_kind: Any) -> pa.Array | None:
    """Field ``name`` of the struct column, when it is of a type ``is_kind`` accepts and has no null."""
    at = struct.type.get_field_index(name)
    if at < 0:
        return None
    column = struct.field(at)
    return column if is_kind(column.type) and column.null_count == 0 else None


def _string_shards(column: pa.Array, shards: int) -> list[int | None]:
    """``shard_of`` each string of an Arrow string column, from its buffers (None where null)."""
    _, offsets, data = column.buffers()
    start = column.offset
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    offs = np.frombuffer(offsets, dtype=width)[start:start + len(column) + 1] if offsets is not None \
        else np.zeros(1, dtype=width)
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
    return shards_of_column(offs, raw, valid, shards)


def segment_columns(data: bytes) -> DecodedSegment:
    """The segment's columns: a reader that loops over columns makes no tuple per record."""
    return DecodedSegment(decode_segment(data))


def segment_rows(data: bytes) -> list[tuple[Any, ...]]:
    """(key, value, timestamp, id) per record, values unpickled."""
    seg = segment_columns(data)
    return list(zip(seg.keys, seg.values, seg.timestamps, seg.ids))
