"""The rows a micro-batch computation's read tasks send its shard tasks, and how each shard gets a
task of its own.

A read task reads through the intake (``engine/intake.py``) and writes what it selects as Arrow
rows, values still as stored: a shard task decodes each value once. A control row per shard
carries the batch's watermarks and wall clock, so every shard task runs, even with no records.
"""

from __future__ import annotations

import pickle
from typing import Any, Mapping

import pyarrow as pa

from ..engine.intake import Selected, is_checked
from ..engine.monoid import Folder
from ..engine.shard import ValueCheck

__all__ = ["RECORD", "CONTROL", "REJECTED", "PARTIAL", "CHECKED", "ROW_SCHEMA", "ROW_DDL", "ddl", "selected_rows",
           "control_rows", "partial_rows", "partition_labels", "spark_hash_int"]

# CHECKED: a record its writer already checked against the typed stream's schema the shard checks;
# PARTIAL: a monoid's (aggregate, records) of a key and window, folded in the read
RECORD, CONTROL, REJECTED, PARTIAL, CHECKED = 0, 1, 2, 3, 4
ROW_SCHEMA = pa.schema([
    ("kind", pa.int8()), ("stream", pa.string()), ("key", pa.string()), ("value", pa.binary()),
    ("timestamp", pa.int64()), ("id", pa.string()), ("shard", pa.int32()), ("part", pa.int32()),
    ("error", pa.string()), ("wm_before", pa.int64()), ("wm_after", pa.int64()), ("wall", pa.int64()),
])

_DDL_TYPES = {pa.int8(): "TINYINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.string(): "STRING",
              pa.binary(): "BINARY"}


def ddl(schema: pa.Schema) -> str:
    """The Spark DDL string of an Arrow schema (the few types these rows use)."""
    return ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in schema)


ROW_DDL = ddl(ROW_SCHEMA)


def _batch(columns: Mapping[str, Any], n: int) -> pa.RecordBatch:
    zeros = pa.array([0] * n, pa.int64())
    full = {"error": pa.nulls(n, pa.string()), "wm_before": zeros, "wm_after": zeros, "wall": zeros, **columns}
    return pa.RecordBatch.from_arrays([full[f.name] if isinstance(full[f.name], pa.Array)
                                       else pa.array(full[f.name], f.type) for f in ROW_SCHEMA], schema=ROW_SCHEMA)


def selected_rows(picked: Selected, labels: list[int], schemas: Mapping[str, ValueCheck]) -> pa.RecordBatch:
    """A segment's selected records as rows bound for their shards' tasks (values as stored), and its
    rejected records bound for shard 0's, with why they have no key."""
    k = picked.keyed
    kind = CHECKED if is_checked(k.seg, schemas.get(k.stream)) else RECORD
    rows = [i for shard in sorted(picked.rows) for i in picked.rows[shard]]
    shards = [shard for shard in sorted(picked.rows) for _ in picked.rows[shard]]
    rows += picked.rejected
    shards += [0] * len(picked.rejected)
    table: pa.Table = k.seg.table  # type: ignore[attr-defined]
    taken = pa.array(rows, pa.int64())
    n, errors, rejected = len(rows), k.errors, set(picked.rejected)
    return _batch({
        "kind": [kind] * (n - len(picked.rejected)) + [REJECTED] * len(picked.rejected),
        "stream": [k.stream] * n,
        "key": [k.keys[i] if k.keys[i] is not None else "" for i in rows],
        "value": table.column("value").take(taken).combine_chunks(),
        "timestamp": table.column("timestamp").take(taken).combine_chunks(),
        "id": table.column("id").take(taken).combine_chunks(),
        "shard": shards, "part": [labels[s] for s in shards],
        "error": [errors[i] if errors is not None and i in rejected else None for i in rows],
    }, n)


def control_rows(shards: int, labels: list[int], wm_before: int, wm_after: int, wall: int) -> pa.RecordBatch:
    """One row per shard with the batch's watermarks and wall clock: every shard's task runs."""
    return _batch({"kind": [CONTROL] * shards, "stream": [None] * shards, "key": [None] * shards,
                   "value": [None] * shards, "timestamp": [0] * shards, "id": [None] * shards,
                   "shard": list(range(shards)), "part": labels[:shards], "wm_before": [wm_before] * shards,
                   "wm_after": [wm_after] * shards, "wall": [wall] * shards}, shards)


def partial_rows(folders: Mapping[int, Folder], labels: list[int]) -> pa.RecordBatch:
    """A read task's partial aggregates (a monoid's), one row per key and window, bound to its shard."""
    parts = [(shard, p) for shard, folder in sorted(folders.items()) for p in folder.partials()]
    n = len(parts)
    return _batch({"kind": [PARTIAL] * n, "stream": [None] * n, "key": [p.key for _, p in parts],
                   "value": [pickle.dumps((p.aggregate, p.records)) for _, p in parts],
                   "timestamp": [p.window for _, p in parts], "id": [None] * n,
                   "shard": [s for s, _ in parts], "part": [labels[s] for s, _ in parts]}, n)


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
