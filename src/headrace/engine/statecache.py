"""A continuous worker's cache of its hot keys' state (MillWheel §6.2's framework cache): the
state a worker read or wrote for an interval it holds, so that the next batch reads only the keys
it has not cached.

An interval's cached state is valid under one sequencer at one version: what the store held
when the worker last read or committed the interval. Every load still reads the interval's row
(version, sequencer, due timers) in its read transaction; a cached value is used only when that
row shows the same sequencer and version, that is when nobody has taken the interval or written
it since. Otherwise the interval's cache is dropped and its state read from the store. The worker
also drops an interval's cache when it loses the lease, is fenced or releases it. Bounded: past
``capacity`` keys, the least recently used go.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from .batch import ShardCommit, ShardSnapshot
from .ports import ShardStore

__all__ = ["StateCache"]

_UNCACHED = object()


class StateCache:
    def __init__(self, capacity: int = 100_000):
        self.capacity = capacity
        self._values: OrderedDict[tuple[str, int, str], bytes | None] = OrderedDict()  # None: no state
        self._keys: dict[tuple[str, int], set[str]] = {}  # each interval's cached keys
        self._valid: dict[tuple[str, int], tuple[int, int]] = {}  # interval -> (sequencer, version)
        self.hits = self.misses = 0
        # a pass's rows of its active intervals, read at once (``prefetch``): (computation, shard) ->
        # (watermark, wall clock, snapshot), each used by the one load of the pass that needs no key
        self._rows: dict[tuple[str, int], tuple[int, int, ShardSnapshot]] = {}

    def __len__(self) -> int:
        return len(self._values)

    def load(self, store: ShardStore, computation: str, shard: int, sequencer: int, keys: list[str],
             watermark: int, wall_clock: int, tags: Sequence[str] = ()) -> ShardSnapshot:
        """``store.load_shard`` for an interval held under ``sequencer``, reading only the keys not
        cached; when the interval changed hands or moved on, its cache is dropped first."""
        interval = (computation, shard)
        cached, missing = self._cached(interval, keys)
        row = self._rows.pop(interval, None)
        if not missing and row is not None and row[:2] == (watermark, wall_clock):
            snapshot = row[2]
        else:
            snapshot = store.load_shard(computation, shard, missing, watermark, wall_clock, tags)
        if self._valid.get(interval) != (sequencer, snapshot.version) or snapshot.sequencer != sequencer:
            self.drop(computation, shard)  # taken, fenced or written by another since it was cached
            if snapshot.sequencer != sequencer:
                return snapshot if not cached else store.load_shard(computation, shard, keys, watermark,
                                                                   wall_clock, tags)  # refused at commit: cache nothing
            self._valid[interval] = (sequencer, snapshot.version)
            if cached:
                cached, missing = self._cached(interval, keys)  # what is left once dropped
                snapshot = store.load_shard(computation, shard, missing, watermark, wall_clock, tags)
        self.hits += len(cached)
        self.misses += len(missing)
        for key in missing:
            self._put(computation, shard, key, snapshot.states.get(key))
        for key, value in cached.items():
            if value is not None:
                snapshot.states.setdefault(key, value)
        return snapshot

    def prefetch(self, store: ShardStore, wanted: Sequence[tuple[str, int, int]], wall_clock: int) -> None:
        """Read the rows of a pass's intervals (computation, shard, watermark) in one round trip,
        for their ``load``s of this pass at this ``wall_clock`` (each read once, then forgotten)."""
        snapshots = store.quiet_snapshots(wanted, wall_clock) if wanted else {}
        self._rows = {(c, s): (watermark, wall_clock, snapshots[(c, s)]) for c, s, watermark in wanted
                      if (c, s) in snapshots}

    def _cached(self, interval: tuple[str, int], keys: list[str]) -> tuple[dict[str, bytes | None], list[str]]:
        """The cached states (None: no state) among ``keys``, and the keys not cached."""
        if interval not in self._valid:
            return {}, keys
        computation, shard = interval
        values = self._values
        cached: dict[str, bytes | None] = {}
        missing = []
        for key in keys:
            entry = (computation, shard, key)
            value = values.get(entry, _UNCACHED)
            if value is _UNCACHED:
                missing.append(key)
            else:
                values.move_to_end(entry)
                cached[key] = value  # type: ignore[assignment]
        return cached, missing

    def committed(self, commit: ShardCommit) -> None:
        """``commit`` was made: its state writes are the interval's state at its new version."""
        interval = (commit.computation, commit.shard)
        if self._valid.get(interval) != (commit.sequencer, commit.base_version):
            self.drop(commit.computation, commit.shard)  # not read through this cache (at-most-once's early commit)
            return
        self._valid[interval] = (commit.sequencer, commit.batch)
        for key, value in commit.state_writes:
            self._put(commit.computation, commit.shard, key, value)

    def drop(self, computation: str, shard: int) -> None:
        """Forget the interval (lost, fenced, released, or read at another version)."""
        self._valid.pop((computation, shard), None)
        self._rows.pop((computation, shard), None)
        for key in self._keys.pop((computation, shard), ()):
            self._values.pop((computation, shard, key), None)

    def clear(self) -> None:
        self._values.clear()
        self._keys.clear()
        self._valid.clear()
        self._rows.clear()

    def _put(self, computation: str, shard: int, key: str, value: bytes | None) -> None:
        entry = (computation, shard, key)
        self._values[entry] = value
        self._values.move_to_end(entry)
        self._keys.setdefault((computation, shard), set()).add(key)
        while len(self._values) > self.capacity:
            (c, s, k), _ = self._values.popitem(last=False)
            self._keys[(c, s)].discard(k)
