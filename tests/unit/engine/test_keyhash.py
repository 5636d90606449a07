"""The columnar ``shard_of``: zlib's CRC-32 of every key at once, equal to a key at a time."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.engine.batch import shard_of
from headrace.engine.keyhash import crc32_column, shards_of_column


def column(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(k) for k in keys]).astype(np.int32)
    return offsets, np.frombuffer(b"".join(keys), dtype=np.uint8)


@settings(deadline=None)
@given(st.lists(st.binary(max_size=40) | st.binary(min_size=250, max_size=300), max_size=60))
def test_each_keys_crc_is_zlibs(keys: list[bytes]) -> None:  # lengths mixed around the zlib cut-off
    assert crc32_column(*column(keys)).tolist() == [zlib.crc32(k) for k in keys]


@settings(deadline=None)
@given(st.lists(st.text(), max_size=60), st.integers(1, 1000))
def test_each_keys_interval_is_shard_ofs(keys: list[str], shards: int) -> None:
    offsets, data = column([k.encode() for k in keys])
    assert shards_of_column(offsets, data, None, shards) == [shard_of(k, shards) for k in keys]


def test_a_key_that_is_not_there_has_no_interval() -> None:
    offsets, data = column([b"a", b"", b"c"])
    assert shards_of_column(offsets, data, np.array([True, False, True]), 7) == [shard_of("a", 7), None, shard_of("c", 7)]


def test_an_empty_column() -> None:
    assert crc32_column(np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.uint8)).tolist() == []
