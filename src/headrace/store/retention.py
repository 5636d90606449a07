"""Retention (docs/architecture.md §3.7, "Retention"): what the bus may forget, and only that.

- A routed segment is one consumer interval's delivery queue: it goes once that interval has read
  past it (its commits' positions, or its quiet report's).
- A stream's own segment is the replayable bus: it goes once every consumer of the stream (each
  computation, each sink) has read past it *and* it is older than the stream's replay window
  (``retention_ms``); a stream without a window keeps its segments.
- A producer's journal rows go with its segments, past every consumer and the window, except its
  last one (consumers and the authority read a producer's head).
- The quiet reports of sequencers no interval holds any more go.
- The journal is compacted: a row goes once it is older than the monitoring horizon
  (``JOURNAL_KEEP_MS``), unless it is its producer's last, a batch whose segments are kept, or at
  or past a reader's position. That bounds the watermark authority's rows (one per change) and the
  rows of interval commits that wrote nothing to the bus.

The trim deletes in steps of ``TRIM_STEP_BATCHES`` batches, each its own transaction: one
statement deleting ten seconds of a 2,000 records/s pipeline held SQLite's write lock for 0.3 to
1.2 s, and every commit of the pipeline waited behind it.

What was trimmed is remembered (``meta.trimmed(stream)``), so that a replay from before the window
is refused with an error that names it rather than reading less than was asked for.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping, NamedTuple, Sequence

from ..errors import OptionError
from ..names import CONTINUOUS, meta
from .intervals import IntervalQueries
from .monitoring import WHOLE_COMPUTATION

__all__ = ["RetentionQueries", "Trimmed", "JOURNAL_KEEP_MS"]

JOURNAL_KEEP_MS = 6 * 60_000  # the dashboard plots the journal of the last 5 minutes (dashboard/history.py)


class Trimmed(NamedTuple):
    routes: int
    segments: int
    batches: int
    reports: int
    journal: int = 0


class RetentionQueries(IntervalQueries):
    """The trim (run by the driver of either mode) and the checks of a replay against it."""

    TRIM_STEP_BATCHES = 100

    def read_through(self, consumer: str) -> dict[str, int]:
        """Per producer, the last batch every interval of ``consumer`` has read (a micro-batch
        computation's, the positions its driver records after each batch; a sink's likewise)."""
        mode = self.computation_modes([consumer]).get(consumer)
        if mode == CONTINUOUS:
            per_interval = self.interval_positions(consumer)
            shards = int(self._one("SELECT shards FROM computations WHERE name = ?", (consumer,))[0])
            producers = {p for positions in per_interval.values() for p in positions}
            return {p: min(per_interval.get(i, {}).get(p, 0) for i in range(shards)) for p in producers}
        return {str(p): int(b) for p, b in self._all(
            "SELECT producer, batch FROM positions WHERE computation = ? AND shard = ?", (consumer, WHOLE_COMPUTATION))}

    def trim(self, readers: Mapping[str, Mapping[str, Sequence[str]]], windows: Mapping[str, int | None],
             now: int) -> Trimmed:
        """Forget what every reader has read: ``readers`` is, per consumer (a computation or
        ``sink:<name>``), the producers of each stream it reads; ``windows`` each stream's replay
        window in ms (None: keep its segments). A trim that waited a whole busy timeout for the
        store's write lock (a pipeline's commits keeping it) gives up, and the next one goes on."""
        try:
            return self._trim(readers, windows, now)
        except Exception as exc:
            if not self._is_busy(exc):
                raise
            return Trimmed(0, 0, 0, 0)

    def _is_busy(self, exc: Exception) -> bool:
        """Whether ``exc`` says the write lock stayed taken for the whole busy timeout."""
        return False

    def _trim(self, readers: Mapping[str, Mapping[str, Sequence[str]]], windows: Mapping[str, int | None],
              now: int) -> Trimmed:
        through = {c: self.read_through(c) for c in readers}
        routes = 0
        for consumer, streams in readers.items():
            for producer in sorted({p for ps in streams.values() for p in ps}):
                read = through[consumer].get(producer, 0)
                if read > 0:
                    routes += self._delete_in_steps("routes WHERE consumer = ? AND producer = ?", (consumer, producer),
                                                    read)
        segments = batches = 0
        for stream, window in windows.items():
            if window is None:
                continue
            readers_of = [c for c, streams in readers.items() if stream in streams]
            producers = sorted({p for c in readers_of for p in readers[c][stream]})
            trimmed = self._trimmed(stream)
            for producer in producers:
                upto = min((through[c].get(producer, 0) for c in readers_of if producer in readers[c][stream]),
                           default=0)
                if upto <= 0:
                    continue
                gone = self._one("SELECT MAX(batch) FROM segments WHERE stream = ? AND producer = ? AND batch <= ? "
                                 "AND created_at < ?", (stream, producer, upto, now - window))[0]
                if gone is None:
                    continue
                # what is forgotten is recorded before it goes: a replay asking for it is refused even
                # while (or if a crash stops) the steps below delete it
                trimmed[producer] = max(trimmed.get(producer, 0), int(gone))
                self._put_meta(meta.trimmed(stream), json.dumps({"window_ms": window, "through": trimmed}))
                segments += self._delete_in_steps("segments WHERE stream = ? AND producer = ?", (stream, producer),
                                                  int(gone))
                # a reader needs the row of the batch it stands at (its watermark): keep it
                head = self.latest_batch(producer)
                batches += self._delete_in_steps("batches WHERE producer = ?", (producer,),
                                                 min(int(gone), upto - 1, (head.batch if head else 0) - 1))
        reports = int(self._x("DELETE FROM interval_groups WHERE NOT EXISTS (SELECT 1 FROM shards s WHERE "
                              "s.computation = interval_groups.computation AND s.sequencer = interval_groups.sequencer)"
                              ).rowcount)
        journal = self._compact_journal(readers, through, now - JOURNAL_KEEP_MS)
        self._reclaim()
        return Trimmed(routes, segments, batches, reports, journal)

    def _delete_in_steps(self, rows: str, params: tuple[Any, ...], through: int) -> int:
        """``DELETE FROM <rows> AND batch <= through``, ``TRIM_STEP_BATCHES`` batches per statement,
        each its own transaction: a store with one writer at a time (SQLite) holds the pipeline's
        commits back for one short step, not for the whole trim."""
        first = self._one(f"SELECT batch FROM {rows} AND batch <= ? ORDER BY batch LIMIT 1", (*params, through))
        low = first[0] if first else None
        gone = 0
        while low is not None and low <= through:
            step = min(int(low) + self.TRIM_STEP_BATCHES - 1, through)
            started = time.monotonic()
            gone += int(self._x(f"DELETE FROM {rows} AND batch <= ?", (*params, step)).rowcount)
            self._between_steps(time.monotonic() - started)
            low = step + 1
        return gone

    def _between_steps(self, took_s: float) -> None:
        """Let the writers a step of ``took_s`` held back in before the next (where the store needs it)."""

    def _reclaim(self) -> None:
        """Give the space the trim freed back where the store keeps it for itself (SQLite's log)."""

    def _compact_journal(self, readers: Mapping[str, Mapping[str, Sequence[str]]],
                         through: Mapping[str, Mapping[str, int]], before: int) -> int:
        """Journal rows completed before ``before`` that nobody needs (the module's docstring)."""
        read: dict[str, int] = {}  # per producer someone reads, the slowest reader's position
        for consumer, streams in readers.items():
            for producer in {p for ps in streams.values() for p in ps}:
                read[producer] = min(read.get(producer, 1 << 62), through[consumer].get(producer, 0))
        gone = 0
        for producer, head in sorted(self.latest_batches(self._journal_producers()).items()):
            upto = head - 1  # a producer's last row stays (consumers and the authority read its head)
            if producer in read:
                if read[producer] <= 1:
                    continue
                upto = min(upto, read[producer] - 1)
            last = self._one("SELECT batch FROM batches WHERE producer = ? AND batch <= ? AND completed_at < ? "
                             "ORDER BY batch DESC LIMIT 1", (producer, upto, before))
            if last is None:
                continue
            old = last[0]
            # per producer and in steps, as the bus's rows go: one statement over the whole journal
            # held SQLite's write lock while it scanned every row
            gone += self._delete_in_steps("batches WHERE producer = ? AND completed_at < ? AND NOT EXISTS "
                                          "(SELECT 1 FROM segments s WHERE s.producer = batches.producer AND "
                                          "s.batch = batches.batch)", (producer, before), int(old))
        return gone

    def _journal_producers(self) -> list[str]:
        """Every producer with rows in the journal, an index seek each (a ``GROUP BY`` over the
        journal would read every row it holds: 100,000 of them in a soak at 2,000 records/s)."""
        found: list[str] = []
        while (row := self._one("SELECT producer FROM batches WHERE producer > ? ORDER BY producer LIMIT 1",
                                (found[-1] if found else "",))) is not None:
            found.append(str(row[0]))
        return found

    def _trimmed(self, stream: str) -> dict[str, int]:
        text = self._get_meta(meta.trimmed(stream))
        return {str(p): int(b) for p, b in json.loads(text)["through"].items()} if text else {}

    def check_replay(self, stream: str, producer: str, after: int) -> None:
        """Refuse to read ``producer``'s batches of ``stream`` after ``after`` when retention has
        forgotten some of them: the error names the window."""
        text = self._get_meta(meta.trimmed(stream))
        if text is None:
            return
        kept = json.loads(text)
        gone = int(kept["through"].get(producer, 0))
        if after < gone:
            raise OptionError(
                f"Stream {stream!r} of {self.shown_url} keeps {producer!r} from its batch {gone + 1} on: retention "
                f"(a replay window of {kept['window_ms']} ms) forgot its batches 1..{gone}",
                got_text=f"a read from its batch {after + 1}",
                hint="read from a later batch or time (start='now', or a time within the window), or run with a "
                     "longer retention_ms to keep more")
