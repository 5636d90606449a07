"""Keying: turning a consumer's input rows into rows keyed for it, each bound to its shard's task.

It runs inside the ``headrace`` source's ``read`` on the executors, so reading a segment and keying
its records are one pass in one Python worker.
"""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pyarrow as pa

from ..engine.batch import shard_of, shards_of
from ..engine.monoid import Folder, columnar_parts, columnar_totals
from ..engine.shard import ValueCheck
from ..errors import MISSING_MODULE_HINT, BadInputError
from ..model import KeyExtractor, MonoidComputation
from ..store.segments import FIELDS, DecodedSegment

__all__ = ["Keying", "SOURCE_SCHEMA", "KEYED_SCHEMA", "KEYED_DDL", "ddl", "RECORD", "CONTROL", "REJECTED", "PARTIAL",
           "partition_labels",
           "spark_hash_int"]

RECORD, CONTROL, REJECTED, PARTIAL = 0, 1, 2, 3  # PARTIAL: a monoid's (aggregate, records) of a key and window
# A consumer's input row, as the source reads it (no shard yet); keying adds the shard and the
# partition label that sends it to its shard's task.
SOURCE_SCHEMA = pa.schema([
    ("kind", pa.int8()), ("stream", pa.string()), ("key", pa.string()), ("value", pa.binary()),
    ("timestamp", pa.int64()), ("id", pa.string()),
    ("wm_before", pa.int64()), ("wm_after", pa.int64()), ("wall", pa.int64()),
])
KEYED_SCHEMA = pa.schema([*SOURCE_SCHEMA][:6] + [pa.field("shard", pa.int32()), pa.field("part", pa.int32())]
                         + [*SOURCE_SCHEMA][6:])

_DDL_TYPES = {pa.int8(): "TINYINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.string(): "STRING",
              pa.binary(): "BINARY"}


def ddl(schema: pa.Schema) -> str:
    """The Spark DDL string of an Arrow schema (the few types these rows use)."""
    return ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in schema)


KEYED_DDL = ddl(KEYED_SCHEMA)


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an INT column (Murmur3 x86_32, seed 42), as a signed 32-bit int."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k1 = rotl(k1, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = rotl(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def partition_labels(shards: int) -> list[int]:
    """Labels whose Spark hash partitioning sends shard i, alone, to partition i.

    ``repartition(n, col)`` places a row by ``pmod(hash(col), n)``: shard numbers themselves
    collide (two shards in one task, another task idle), so each shard travels with the first
    integer that hashes to its own partition.
    """
    found: dict[int, int] = {}
    label = 0
    while len(found) < shards:
        found.setdefault(spark_hash_int(label) % shards, label)
        label += 1
    return [found[p] for p in range(shards)]


# rows to take, their keys and shards, and the rejected ones' dead-letter values by output row
_Keyed = tuple[list[int], list[Any], list[int], dict[int, bytes]]


@dataclass
class Keying:
    """How one consumer keys its input. Input that cannot be decoded or keyed fails the batch with
    an error naming it, or, with ``on_error="dead_letter"``, goes to shard 0 as a rejected row."""

    computation: str
    extractors: dict[str, KeyExtractor]
    shards: int
    dead_letters: bool = False
    monoid: MonoidComputation | None = None  # a monoid computation: records are folded in the read
    fold_streams: frozenset[str] = frozenset()  # the streams it folds (not those whose ids are checked)
    schemas: Mapping[str, ValueCheck] = field(default_factory=dict)  # typed streams it checks before folding

    def __post_init__(self) -> None:
        self.labels = partition_labels(self.shards)
        self._shard_ids: dict[str, int] = {}  # each key's shard, computed once per read task

    def folder(self, watermark_before: int) -> Folder | None:
        """A Folder for one read task of a monoid computation; None for any other computation."""
        return None if self.monoid is None else Folder(self.monoid, self.computation, watermark_before)

    def partial_rows(self, folder: Folder) -> pa.RecordBatch:
        """The read task's partial aggregates, one row each, keyed and bound to their shard."""
        parts = folder.partials()
        n = len(parts)
        shard_ids = [shard_of(p.key, self.shards) for p in parts]
        zeros = pa.array([0] * n, pa.int64())
        return pa.RecordBatch.from_arrays([
            pa.array([PARTIAL] * n, pa.int8()), pa.array([None] * n, pa.string()),
            pa.array([p.key for p in parts], pa.string()),
            pa.array([pickle.dumps((p.aggregate, p.records)) for p in parts], pa.binary()),
            pa.array([p.window for p in parts], pa.int64()), pa.array([None] * n, pa.string()),
            pa.array(shard_ids, pa.int32()), pa.array([self.labels[i] for i in shard_ids], pa.int32()),
            zeros, zeros, zeros], schema=KEYED_SCHEMA)

    def fold_fields(self, table: pa.Table, stream: str, folder: Folder) -> pa.Table:
        """A typed stream's segment folded from its field columns when it can be
        (``columnar_parts``): the rows left to key (late ones); else the whole segment."""
        if stream not in self.fold_streams or FIELDS not in table.schema.names:
            return table
        seg = DecodedSegment(table)
        extractor, schema = self.extractors[stream], self.schemas.get(stream)
        totals = columnar_totals(folder, extractor, seg, schema, folder.before)
        if totals is not None:  # no record late: all folded
            folder.add_totals(totals)
            return table.slice(0, 0)
        columns = columnar_parts(folder, extractor, seg, schema)
        if columns is None:
            return table
        late = folder.add_columns(*columns, seg.timestamps, range(len(seg)))
        return table.take(pa.array(late, pa.int64()))

    def to_option(self) -> str:
        from pyspark import cloudpickle

        return base64.b64encode(cloudpickle.dumps(self)).decode()

    @staticmethod
    def from_option(text: str) -> "Keying":
        return pickle.loads(base64.b64decode(text))

    def apply(self, rb: pa.RecordBatch, folder: Folder | None = None) -> pa.RecordBatch:
        """Rows of the source (no key yet) -> keyed rows; a control row becomes one per shard. With
        a ``folder``, the records it folds leave no row (``partial_rows`` sends their aggregates)."""
        kinds = rb.column("kind").to_pylist()
        streams, values, ids = rb.column("stream").to_pylist(), rb.column("value").to_pylist(), rb.column("id").to_pylist()
        stamps = rb.column("timestamp").to_pylist() if folder is not None else []
        keyed = (self._key_segment(streams[0], values, ids, stamps, folder)
                 if kinds and streams[0] is not None and kinds.count(RECORD) == len(kinds) and
                 streams.count(streams[0]) == len(streams) else None)
        if keyed is None:
            keyed = self._key_each(kinds, streams, values, ids, stamps, folder)
        take, keys, shard_ids, rejected = keyed
        picked = rb.take(pa.array(take, pa.int64()))
        columns = {name: picked.column(name) for name in picked.schema.names}
        columns["key"] = pa.array(keys, pa.string())
        if rejected:
            columns["kind"] = pa.array([REJECTED if j in rejected else k
                                        for j, k in enumerate(columns["kind"].to_pylist())], pa.int8())
            columns["value"] = pa.array([rejected.get(j, v) for j, v in enumerate(columns["value"].to_pylist())],
                                        pa.binary())
        columns["shard"] = pa.array(shard_ids, pa.int32())
        columns["part"] = pa.array([self.labels[i] for i in shard_ids], pa.int32())
        return pa.RecordBatch.from_arrays([columns[name] for name in KEYED_SCHEMA.names], schema=KEYED_SCHEMA)

    def _key_segment(self, stream: str, values: list[bytes], ids: list[str], stamps: list[int],
                     folder: Folder | None) -> _Keyed | None:
        """Rows of one stream keyed a column at a time; None if some row cannot be decoded or keyed
        (``_key_each`` then finds which, and why)."""
        try:
            decoded = list(map(pickle.loads, values))
        except Exception:
            return None
        keys = self.extractors[stream].many(decoded)
        if keys is None:
            return None
        take: Sequence[int] = range(len(keys))
        if folder is not None and stream in self.fold_streams:
            take = folder.add_many(keys, decoded, stamps, ids, take, self.schemas.get(stream))
            keys = [keys[i] for i in take]
        if len(self._shard_ids) > 100_000:
            self._shard_ids.clear()
        return list(take), keys, shards_of(keys, self.shards, self._shard_ids), {}

    def _key_each(self, kinds: list[int], streams: list[Any], values: list[bytes], ids: list[str], stamps: list[int],
                  folder: Folder | None) -> _Keyed:
        """Rows keyed one at a time: a control row becomes one per shard, and a row that cannot be
        decoded or keyed fails the batch or is rejected to shard 0."""
        loads = pickle.loads
        take: list[int] = []
        keys: list[str | None] = []
        shard_ids: list[int] = []
        rejected: dict[int, bytes] = {}
        for i, kind in enumerate(kinds):
            if kind == CONTROL:
                take.extend([i] * self.shards)
                keys.extend([None] * self.shards)
                shard_ids.extend(range(self.shards))
                continue
            stream = streams[i]
            stage = "decoding it"
            try:
                value = loads(values[i])
                stage = "extracting its key with " + self.extractors[stream].description
                key = self.extractors[stream](value)
            except Exception as exc:
                cause = f"{type(exc).__name__}: {exc}"
                if not self.dead_letters:
                    raise BadInputError(
                        f"Computation {self.computation!r} cannot take record {ids[i]!r} of stream {stream!r}: "
                        f"failed {stage}", got_text=cause,
                        hint=MISSING_MODULE_HINT if isinstance(exc, ImportError) and stage == "decoding it" else
                        "fix the record or the key extractor, or add the computation with "
                        "on_error='dead_letter' to route such records aside") from None
                rejected[len(take)] = pickle.dumps({
                    "computation": self.computation, "key": None, "at": f"failed {stage}", "stream": stream,
                    "record_id": ids[i], "value": values[i], "error": cause})
                take.append(i)
                keys.append("")
                shard_ids.append(0)
                continue
            if (folder is not None and stream in self.fold_streams
                    and not folder.add_many([key], [value], [stamps[i]], [ids[i]], (0,), self.schemas.get(stream))):
                continue
            take.append(i)
            keys.append(key)
            shard_ids.append(shard_of(key, self.shards))
        return take, keys, shard_ids, rejected
