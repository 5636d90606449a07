"""Record-id deduplication: a Bloom filter in front of the store's exact check (MillWheel 5.2)."""

from __future__ import annotations

import heapq
import math
from operator import attrgetter
from typing import Callable, Iterable, Sequence

import numpy as np

from ..model import BEGINNING_OF_TIME, ComputationOptions
from .batch import InputRecord, ShardBatch
from .seen import NO_IDS, SeenIds, SeenRange, make_ranges, range_holds, split_ids

__all__ = ["BloomFilter", "DedupIndex", "IdCheck", "drop_duplicates", "forget_before"]


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
    """Which of a batch's ids one shard has seen, checked a batch at a time (``engine/seen.py``).

    Positional ids are checked against the extents (prefix, low, high) of the shard's ranges,
    kept in memory: an id outside every extent of its prefix is certainly new, and only ranges
    that overlap a batch's numbers are read (``lookup_ranges``) and tested bit by bit. Other ids
    go through a Bloom filter, whose "maybe" is confirmed by ``lookup`` (the store's exact check).
    Both are valid for one shard version under one writer: after a commit by someone else, or
    under a new writer (which a re-partition of the keys always brings, and which may have moved
    ids into the shard at the same version), the caller rebuilds them (``load_all``,
    ``load_extents``).
    """

    def __init__(self, lookup: Callable[[list[str]], set[str]], load_all: Callable[[], Iterable[str]],
                 lookup_ranges: Callable[[str, int, int], list[SeenRange]] = lambda prefix, low, high: [],
                 load_extents: Callable[[], Iterable[tuple[str, int, int, int]]] = lambda: ()):
        self._lookup = lookup
        self._load_all = load_all
        self._lookup_ranges = lookup_ranges
        self._load_extents = load_extents
        self._bloom: BloomFilter | None = None
        self._extents: dict[str, list[tuple[int, int]]] = {}  # prefix -> (low, high) of its ranges
        self._ages: list[tuple[int, str, int, int]] = []  # a heap of (newest, prefix, low, high)
        self.version: int | None = None
        self.writer: int | None = None

    def ensure(self, version: int, writer: int) -> None:
        """Valid for ``version`` of the shard under the sequencer ``writer``: rebuilt unless it is."""
        if self._bloom is None or self.version != version or self.writer != writer or self._bloom.saturated:
            ids = list(self._load_all())
            bloom = BloomFilter(capacity=max(100_000, 4 * len(ids)))
            bloom.add_many(ids)
            self._extents, self._ages = {}, []
            for prefix, low, high, newest in self._load_extents():
                self._extents.setdefault(prefix, []).append((low, high))
                self._ages.append((newest, prefix, low, high))
            heapq.heapify(self._ages)
            self._bloom, self.version, self.writer = bloom, version, writer

    def seen(self, ids: list[str]) -> set[str]:
        """The ids the shard has already committed."""
        duplicates, _ = self.check(ids, [0] * len(ids), repeats=False)
        return {ids[i] for i in duplicates}

    def check(self, ids: list[str], timestamps: list[int], repeats: bool = True) -> tuple[list[int], SeenIds]:
        """The positions in ``ids`` of the duplicates (committed before, or, with ``repeats``, an
        earlier position holds the same id), and the others as the seen ids to commit."""
        bloom = self._built("check(ids, timestamps)")
        split = split_ids(ids)
        stamps = np.asarray(timestamps, np.int64)
        duplicate = np.zeros(len(ids), bool)
        ranges: list[SeenRange] = []
        for prefix, (positions, numbers) in split.groups.items():
            unique, first = np.unique(numbers, return_index=True)
            if repeats and len(unique) != len(numbers):
                duplicate[positions] = True
                duplicate[positions[first]] = False
            held = self._held(prefix, unique)
            duplicate[positions[first[held]]] = True
            fresh = ~held
            ranges.extend(make_ranges(prefix, unique[fresh], stamps[positions[first[fresh]]]))
        exact: list[tuple[str, int]] = []
        if split.exact:
            others = [ids[i] for i in split.exact]
            maybe = [i for i, hit in zip(others, bloom.contains_many(others)) if hit]
            known = self._lookup(maybe) if maybe else set()
            in_batch: set[str] = set()
            for i, rid in zip(split.exact, others):
                if rid in known or rid in in_batch:
                    duplicate[i] = True
                    continue
                if repeats:
                    in_batch.add(rid)
                exact.append((rid, timestamps[i]))
        return np.flatnonzero(duplicate).tolist(), SeenIds(exact, ranges)

    def _held(self, prefix: str, numbers: np.ndarray) -> np.ndarray:
        """Which of these sorted numbers the shard's ranges under ``prefix`` hold."""
        held = np.zeros(len(numbers), bool)
        low, high = int(numbers[0]), int(numbers[-1])
        if any(lo <= high and hi >= low for lo, hi in self._extents.get(prefix, ())):
            for r in self._lookup_ranges(prefix, low, high):
                held |= range_holds(r, numbers)
        return held

    def committed(self, version: int, seen: SeenIds, forget_before: int | None = None) -> None:
        """The shard committed ``version`` adding ``seen`` and forgetting ranges older than
        ``forget_before`` (as the commit did in the store): keep the index in step."""
        self._built("committed(version, seen)").add_many([i for i, _ in seen.exact])
        for r in seen.ranges:
            self._extents.setdefault(r.prefix, []).append((r.low, r.high))
            heapq.heappush(self._ages, (r.newest, r.prefix, r.low, r.high))
        while forget_before is not None and self._ages and self._ages[0][0] < forget_before:
            _, prefix, low, high = heapq.heappop(self._ages)
            extents = self._extents[prefix]
            extents.remove((low, high))
            if not extents:
                del self._extents[prefix]
        self.version = version

    def _built(self, call: str) -> BloomFilter:
        if self._bloom is None:
            raise RuntimeError(f"DedupIndex.{call} was called before ensure(version, writer): call ensure(version, writer) first")
        return self._bloom


_STREAM, _ID, _TIMESTAMP = attrgetter("stream"), attrgetter("id"), attrgetter("timestamp")
IdCheck = Callable[[list[str], list[int]], "tuple[list[int], SeenIds]"]  # DedupIndex.check


def drop_duplicates(batch: ShardBatch, options: ComputationOptions, check_ids: IdCheck | None,
                    counters: dict[str, int]) -> tuple[list[InputRecord], SeenIds]:
    """The batch's records less those whose id was seen (on the streams that need the check), and
    the ids to remember: checked for the whole batch at once (``DedupIndex.check``)."""
    records = batch.records
    if not (options.dedup and batch.dedup_streams) or check_ids is None:
        return records, NO_IDS
    streams = batch.dedup_streams
    at = (None if streams.issuperset(map(_STREAM, records))
          else [i for i, r in enumerate(records) if r.stream in streams])
    checked = records if at is None else [records[i] for i in at]
    duplicates, seen = check_ids(list(map(_ID, checked)), list(map(_TIMESTAMP, checked)))
    if duplicates:
        counters["duplicates"] += len(duplicates)
        dropped = set(duplicates if at is None else (at[i] for i in duplicates))
        records = [r for i, r in enumerate(records) if i not in dropped]
    return records, seen


def forget_before(watermark: int, options: ComputationOptions) -> int | None:
    """Seen ids older than the low watermark minus the slack are garbage: such records are late anyway."""
    if not options.dedup or watermark - options.dedup_slack_ms <= BEGINNING_OF_TIME:
        return None
    return watermark - options.dedup_slack_ms
