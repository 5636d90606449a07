"""Record-id deduplication: a Bloom filter in front of the store's exact check (MillWheel 5.2)."""

from __future__ import annotations

import hashlib
import math
from typing import Callable, Iterable

__all__ = ["BloomFilter", "DedupIndex"]


class BloomFilter:
    """A fixed-size Bloom filter over strings; deterministic across processes (no ``hash()``)."""

    __slots__ = ("bits", "size", "hashes", "count")

    def __init__(self, capacity: int = 100_000, error_rate: float = 0.01):
        capacity = max(capacity, 1)
        self.size = max(64, int(-capacity * math.log(error_rate) / (math.log(2) ** 2)))
        self.hashes = max(1, round(self.size / capacity * math.log(2)))
        self.bits = bytearray((self.size + 7) // 8)
        self.count = 0

    def _positions(self, item: str) -> Iterable[int]:
        digest = hashlib.blake2b(item.encode(), digest_size=16).digest()
        h1 = int.from_bytes(digest[:8], "little")
        h2 = int.from_bytes(digest[8:], "little") | 1
        size = self.size
        return ((h1 + i * h2) % size for i in range(self.hashes))

    def add(self, item: str) -> None:
        bits = self.bits
        for p in self._positions(item):
            bits[p >> 3] |= 1 << (p & 7)
        self.count += 1

    def __contains__(self, item: str) -> bool:
        bits = self.bits
        return all(bits[p >> 3] & (1 << (p & 7)) for p in self._positions(item))

    @property
    def saturated(self) -> bool:
        """True once it holds more than it was sized for; it should then be rebuilt bigger."""
        return self.count > self.size * (math.log(2) ** 2) / -math.log(0.01)


class DedupIndex:
    """Which of a batch's ids were already seen by one shard.

    The Bloom filter answers "certainly new" for almost every new id without touching the store;
    a "maybe" is confirmed by ``lookup`` (the store's exact check). The filter is valid for one
    shard version: after a commit by someone else the caller rebuilds it from ``load_all``.
    """

    def __init__(self, lookup: Callable[[list[str]], set[str]], load_all: Callable[[], Iterable[str]]):
        self._lookup = lookup
        self._load_all = load_all
        self._bloom: BloomFilter | None = None
        self.version: int | None = None
        self.exact_checks = 0

    def ensure(self, version: int) -> None:
        if self._bloom is None or self.version != version or self._bloom.saturated:
            ids = list(self._load_all())
            bloom = BloomFilter(capacity=max(100_000, 4 * len(ids)))
            for i in ids:
                bloom.add(i)
            self._bloom, self.version = bloom, version

    def seen(self, ids: list[str]) -> set[str]:
        assert self._bloom is not None, "ensure(version) first"
        bloom = self._bloom
        maybe = [i for i in ids if i in bloom]
        if not maybe:
            return set()
        self.exact_checks += len(maybe)
        return self._lookup(maybe)

    def committed(self, version: int, ids: Iterable[str]) -> None:
        """The shard committed ``version`` adding ``ids``: keep the filter in step."""
        assert self._bloom is not None
        for i in ids:
            self._bloom.add(i)
        self.version = version
