"""Record-id deduplication: a Bloom filter in front of the store's exact check (MillWheel 5.2)."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

from ..model import BEGINNING_OF_TIME, ComputationOptions
from .batch import InputRecord, ShardBatch

__all__ = ["BloomFilter", "DedupIndex", "drop_duplicates", "forget_before"]


class BloomFilter:
    """A Bloom filter over strings, checked and filled a batch at a time with numpy.

    Positions come from Python's ``hash``, which is salted per process: a filter lives only in
    the process that built it (it is rebuilt from the store's exact ids in a new process).
    """

    __slots__ = ("bits", "size", "hashes", "count", "capacity", "error_rate")

    def __init__(self, capacity: int = 100_000, error_rate: float = 0.01):
        capacity = max(capacity, 1)
        self.capacity = capacity
        self.error_rate = error_rate
        self.size = max(64, int(-capacity * math.log(error_rate) / (math.log(2) ** 2)))
        self.hashes = max(1, round(self.size / capacity * math.log(2)))
        self.bits = np.zeros((self.size + 7) // 8, dtype=np.uint8)
        self.count = 0

    def _positions(self, items: Sequence[str]) -> np.ndarray:
        h1 = np.fromiter(map(hash, items), dtype=np.int64, count=len(items)).view(np.uint64)
        h2 = (h1 * np.uint64(0x9E3779B97F4A7C15)) ^ (h1 >> np.uint64(29)) | np.uint64(1)
        steps = np.arange(self.hashes, dtype=np.uint64)
        return (h1[:, None] + steps[None, :] * h2[:, None]) % np.uint64(self.size)

    def add_many(self, items: Sequence[str]) -> None:
        if not items:
            return
        positions = self._positions(items).ravel()
        np.bitwise_or.at(self.bits, positions >> np.uint64(3), (1 << (positions & np.uint64(7))).astype(np.uint8))
        self.count += len(items)

    def contains_many(self, items: Sequence[str]) -> np.ndarray:
        """One bool per item: False means certainly absent, True means maybe present."""
        if not items:
            return np.zeros(0, dtype=bool)
        positions = self._positions(items)
        hits = self.bits[positions >> np.uint64(3)] & (1 << (positions & np.uint64(7))).astype(np.uint8)
        return hits.all(axis=1)

    @property
    def saturated(self) -> bool:
        """True once it holds more than it was sized for (its false positives then pass its
        ``error_rate``); it should be rebuilt bigger."""
        return self.count > self.capacity


class DedupIndex:
    """Which of a batch's ids were already seen by one shard.

    The Bloom filter answers "certainly new" for almost every new id without touching the store;
    a "maybe" is confirmed by ``lookup`` (the store's exact check). The filter is valid for one
    shard version under one writer: after a commit by someone else, or under a new writer (which a
    re-partition of the keys always brings, and which may have moved ids into the shard at the same
    version), the caller rebuilds it from ``load_all``.
    """

    def __init__(self, lookup: Callable[[list[str]], set[str]], load_all: Callable[[], Iterable[str]]):
        self._lookup = lookup
        self._load_all = load_all
        self._bloom: BloomFilter | None = None
        self.version: int | None = None
        self.writer: int | None = None

    def ensure(self, version: int, writer: int) -> None:
        """Valid for ``version`` of the shard under the sequencer ``writer``: rebuilt unless it is."""
        if self._bloom is None or self.version != version or self.writer != writer or self._bloom.saturated:
            ids = list(self._load_all())
            bloom = BloomFilter(capacity=max(100_000, 4 * len(ids)))
            bloom.add_many(ids)
            self._bloom, self.version, self.writer = bloom, version, writer

    def seen(self, ids: list[str]) -> set[str]:
        bloom = self._built("seen(ids)")
        maybe = [i for i, hit in zip(ids, bloom.contains_many(ids)) if hit]
        if not maybe:
            return set()
        return self._lookup(maybe)

    def committed(self, version: int, ids: Iterable[str]) -> None:
        """The shard committed ``version`` adding ``ids``: keep the filter in step."""
        self._built("committed(version, ids)").add_many(list(ids))
        self.version = version

    def _built(self, call: str) -> BloomFilter:
        if self._bloom is None:
            raise RuntimeError(f"DedupIndex.{call} was called before ensure(version, writer): call ensure(version, writer) first")
        return self._bloom


def drop_duplicates(batch: ShardBatch, options: ComputationOptions, is_duplicate: Callable[[list[str]], set[str]],
                    counters: dict[str, int]) -> tuple[list[InputRecord], list[tuple[str, int]]]:
    """The batch's records less those whose id was seen (on the streams that need the check), and
    the ids to remember."""
    records = batch.records
    seen_ids: list[tuple[str, int]] = []
    if options.dedup and batch.dedup_streams:
        checked = [r for r in records if r.stream in batch.dedup_streams]
        already = is_duplicate([r.id for r in checked])
        fresh: list[InputRecord] = []
        in_batch: set[str] = set()
        for r in records:
            if r.stream in batch.dedup_streams:
                if r.id in already or r.id in in_batch:
                    counters["duplicates"] += 1
                    continue
                in_batch.add(r.id)
                seen_ids.append((r.id, r.timestamp))
            fresh.append(r)
        records = fresh
    return records, seen_ids


def forget_before(watermark: int, options: ComputationOptions) -> int | None:
    """Seen ids older than the low watermark minus the slack are garbage: such records are late anyway."""
    if not options.dedup or watermark - options.dedup_slack_ms <= BEGINNING_OF_TIME:
        return None
    return watermark - options.dedup_slack_ms
