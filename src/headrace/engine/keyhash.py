"""``shard_of`` of a whole column of keys at once: zlib's CRC-32 of each key's UTF-8 bytes, computed
with numpy from the column's offsets and bytes (an Arrow string array's buffers), a byte position
of every key per step, so that a reader assigns a segment's records to intervals without a Python
call per record. It equals ``zlib.crc32`` on every input (tests/unit/engine/test_keyhash.py)."""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["crc32_column", "shards_of_column"]

_POLY = 0xEDB88320
_LONG = 256  # bytes: a key longer than this is hashed by zlib, so that one long key costs no steps


def _table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (_POLY ^ (c >> 1)) if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _table()


def crc32_column(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """``zlib.crc32`` of each of the ``len(offsets) - 1`` byte strings ``data[offsets[i]:offsets[i + 1]]``,
    as uint32. The strings are taken longest first, so that step ``j`` updates a prefix of them."""
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    out = np.empty(len(starts), dtype=np.uint32)
    long = np.flatnonzero(lengths > _LONG)
    for i in long.tolist():
        out[i] = zlib.crc32(data[starts[i]:starts[i] + lengths[i]].tobytes())
    short = np.flatnonzero(lengths <= _LONG) if len(long) else np.arange(len(starts))
    order = short[np.argsort(-lengths[short], kind="stable")]
    ordered_starts, ordered_lengths = starts[order], lengths[order]
    crc = np.full(len(order), 0xFFFFFFFF, dtype=np.uint32)
    longest = int(ordered_lengths[0]) if len(order) else 0
    live = np.searchsorted(-ordered_lengths, -np.arange(longest), side="left")  # strings longer than j
    for j in range(longest):
        m = int(live[j])
        c = crc[:m]
        crc[:m] = _TABLE[(c ^ data[ordered_starts[:m] + j]) & 0xFF] ^ (c >> 8)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def shards_of_column(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None, shards: int) -> list[int | None]:
    """``shard_of`` of each string of the column (None where ``valid`` is False: no key)."""
    sids = (crc32_column(offsets, data).astype(np.int64) % shards).tolist()  # past 2**32 intervals too
    if valid is not None and not valid.all():
        for i in np.flatnonzero(~valid).tolist():
            sids[i] = None
    return sids
