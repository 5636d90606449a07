"""What monitoring reads from a store, and the two tables it writes (``events``, ``samples``).

Kept apart from ``sql.py``: none of it is on a commit's path, and every query here is a read of
committed rows (or a write of a row nothing else reads), so it is safe from any process at any time.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .intervals import IntervalQueries

__all__ = ["MonitorQueries", "ShardRow", "Event", "Sample", "WHOLE_COMPUTATION"]

# The ``positions`` row shard of a micro-batch computation: its driver reads every shard at once.
WHOLE_COMPUTATION = -1


class ShardRow(NamedTuple):
    shard: int
    version: int
    input_watermark: int
    output_watermark: int
    sequencer: int
    owner: str | None
    lease_until: int


class Event(NamedTuple):
    name: str
    at: int
    kind: str
    detail: str


class Sample(NamedTuple):
    name: str
    at: int
    records: int
    input_watermark: int
    output_watermark: int
    backlog: int


class MonitorQueries(IntervalQueries):
    """What ``headrace status``, the monitor and the dashboard read, and what they write."""

    def computations(self) -> dict[str, int]:
        """Every registered computation and its shard count."""
        return {str(n): int(s) for n, s in self._all("SELECT name, shards FROM computations ORDER BY name")}

    def shard_rows(self, computation: str) -> list[ShardRow]:
        return [ShardRow(int(s), int(v), int(i), int(o), int(q), w, int(u)) for s, v, i, o, q, w, u in self._all(
            "SELECT shard, version, input_watermark, output_watermark, sequencer, owner, lease_until FROM shards "
            "WHERE computation = ? ORDER BY shard", (computation,))]

    def all_positions(self, computation: str) -> dict[int, dict[str, int]]:
        """Per shard (``WHOLE_COMPUTATION`` in micro-batch mode): the last batch read of each producer
        (a quiet interval's as its owner reported it)."""
        out = self.interval_positions(computation)
        for producer, batch in self._all("SELECT producer, batch FROM positions WHERE computation = ? AND shard = ?",
                                         (computation, WHOLE_COMPUTATION)):
            out.setdefault(WHOLE_COMPUTATION, {})[str(producer)] = int(batch)
        return out
    def record_positions(self, computation: str, shard: int, positions: dict[str, int]) -> None:
        """Where a micro-batch computation has read up to (its Spark offsets), for monitoring only."""
        self._xmany("INSERT INTO positions VALUES (?, ?, ?, ?) ON CONFLICT(computation, shard, producer) "
                    "DO UPDATE SET batch = excluded.batch",
                    [(computation, shard, p, b) for p, b in sorted(positions.items())])

    def records_between(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> int:
        """How many records ``producer`` committed to ``stream`` in batches (after, upto]."""
        row = self._one("SELECT COALESCE(SUM(count), 0) FROM segments WHERE stream = ? AND producer = ? AND batch > ? "
                        "AND batch <= ?", (stream, producer, after_batch, upto_batch))
        return int(row[0])

    def records_of(self, producers: list[str], since_ms: int | None = None, recent: int = 1_000) -> int:
        """How many records these producers committed (to any stream); with ``since_ms``, only at or
        after it, looking at their last ``recent`` batches (an index range, however long the run)."""
        total = 0
        for producer, head in self.latest_batches(producers).items():
            if since_ms is None:
                row = self._one("SELECT COALESCE(SUM(count), 0) FROM segments WHERE producer = ?", (producer,))
            else:
                row = self._one("SELECT COALESCE(SUM(count), 0) FROM segments WHERE producer = ? AND batch > ? "
                                "AND created_at >= ?", (producer, head - recent, since_ms))
            total += int(row[0])
        return total

    def commit_times(self, producers: list[str], since_ms: int, recent: int = 1_000) -> dict[str, list[int]]:
        """Per producer, when each of its batches journaled at or after ``since_ms`` completed, in
        order, looking at its last ``recent`` batches."""
        out: dict[str, list[int]] = {}
        if not producers:
            return out
        # one statement (a computation of 100,000 intervals is 100,000 producers): per producer, an
        # index seek for its head, then a range of its last ``recent`` batches
        values, param = self._values("p", sorted(set(producers)))
        last = "(SELECT batch FROM batches WHERE producer = p ORDER BY batch DESC LIMIT 1)"
        for producer, at in self._all(
                f"SELECT b.producer, b.completed_at FROM "
                f"{self._per_range(values, 'batches b', f'b.producer = p AND b.batch > {last} - ?')} "
                "WHERE b.completed_at >= ? ORDER BY b.producer, b.batch", (param, recent, since_ms)):
            out.setdefault(str(producer), []).append(int(at))
        return out

    def state_keys(self, computation: str, limit: int = 10) -> list[str]:
        return [str(r[0]) for r in self._all("SELECT key FROM state WHERE computation = ? ORDER BY key LIMIT ?",
                                             (computation, limit))]

    def timer_keys(self, computation: str, limit: int = 10) -> list[str]:
        return [str(r[0]) for r in self._all("SELECT DISTINCT key FROM timers WHERE computation = ? ORDER BY key "
                                             "LIMIT ?", (computation, limit))]

    # -- events: alerts raised and cleared, errors ---------------------------------------------------
    def add_event(self, name: str, kind: str, at: int, detail: str) -> None:
        self._x("INSERT INTO events VALUES (?, ?, ?, ?) ON CONFLICT(name, kind, at) DO UPDATE SET detail = "
                "excluded.detail", (name, at, kind, detail))

    def events(self, since_ms: int = 0, kinds: Sequence[str] = ()) -> list[Event]:
        """Events at or after ``since_ms`` (of these kinds, if given), oldest first."""
        rows = self._all("SELECT name, at, kind, detail FROM events WHERE at >= ? ORDER BY at, name, kind",
                         (since_ms,))
        return [Event(str(n), int(a), str(k), str(d)) for n, a, k, d in rows if not kinds or k in kinds]

    def latest_events(self, kinds: Sequence[str]) -> dict[str, Event]:
        """Per name, its latest event of these kinds."""
        latest: dict[str, Event] = {}
        for kind in kinds:
            for n, a, k, d in self._all(
                    "SELECT e.name, e.at, e.kind, e.detail FROM events e JOIN (SELECT name, MAX(at) AS at FROM events "
                    "WHERE kind = ? GROUP BY name) m ON e.name = m.name AND e.at = m.at WHERE e.kind = ?",
                    (kind, kind)):
                if n not in latest or int(a) >= latest[n].at:
                    latest[str(n)] = Event(str(n), int(a), str(k), str(d))
        return latest

    # -- samples: a short history of each stage, written by the running driver -----------------------
    def add_samples(self, rows: list[Sample]) -> None:
        self._xmany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(name, at) DO NOTHING",
                    [tuple(r) for r in rows])

    def samples(self, since_ms: int, name: str | None = None) -> list[Sample]:
        rows = self._all("SELECT name, at, records, input_watermark, output_watermark, backlog FROM samples "
                         "WHERE at >= ? ORDER BY name, at", (since_ms,))
        return [Sample(*r) for r in rows if name is None or r[0] == name]

    def trim_samples(self, before_ms: int) -> int:
        return int(self._x("DELETE FROM samples WHERE at < ?", (before_ms,)).rowcount)
