"""The writes of key intervals' batch outcomes, in as few statements as the outcomes allow: a
continuous worker's pass commits every interval that had work in one transaction, and its writes
go out one statement per table, not one per interval (on PostgreSQL each statement is a round
trip: a pass of six intervals took some 70 of them, 11 ms).

The intervals' rows are locked and checked first, in one order, so each outcome the store must
refuse (its writer fenced, its version moved on) is known before anything is written, and the
rest are written together."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..engine.batch import ShardCommit
from ..errors import FencedWriterError, StaleBatchError, StoreError
from .bus import BusQueries, EncodedSegments

__all__ = ["OutcomeWrites"]


class OutcomeWrites(BusQueries):
    """Locking, checking and writing several intervals' outcomes inside the caller's transaction."""

    def _refusals(self, commits: Sequence[ShardCommit]) -> list[StoreError | None]:
        """Lock each commit's interval row (``FOR UPDATE`` where the database has row locks: a
        takeover waits for this transaction, then fences every later one), in (computation,
        shard) order so that two writers never deadlock, and say which commits the store must
        refuse: fenced (a newer sequencer holds the interval) or stale (exactly-once, and the
        interval's version is no longer the batch's base)."""
        if not commits:
            return []
        wanted: dict[str, set[int]] = {}
        for c in commits:
            wanted.setdefault(c.computation, set()).add(c.shard)
        conditions, params = [], []
        for computation in sorted(wanted):
            condition, param = self._in_list("shard", sorted(wanted[computation]))
            conditions.append(f"(computation = ? AND {condition})")
            params += [computation, param]
        rows = {(str(computation), int(shard)): (int(sequencer), int(version))
                for computation, shard, sequencer, version in self._all(
                    f"SELECT computation, shard, sequencer, version FROM shards WHERE {' OR '.join(conditions)} "
                    f"ORDER BY computation, shard{self.FOR_UPDATE}", params)}
        return [_refusal(c, rows.get((c.computation, c.shard))) for c in commits]

    def _write_outcomes(self, commits: Sequence[ShardCommit], encoded: Sequence[EncodedSegments | None]) -> None:
        """The commits' writes (each already checked by ``_refusals``) up to their productions,
        one statement per table and kind; the caller writes their counters (``_write_counters``)
        and moves their versions (``_write_versions``)."""
        step, many = self._step, self._xmany
        step("state")
        many("INSERT INTO state VALUES (?, ?, ?) ON CONFLICT(computation, key) DO UPDATE SET value = excluded.value",
             [(c.computation, k, v) for c in commits for k, v in c.state_writes if v is not None])
        many("DELETE FROM state WHERE computation = ? AND key = ?",
             [(c.computation, k) for c in commits for k, v in c.state_writes if v is None])
        # monoid partials merge without reading: a delta row per (key, window) and batch; a
        # batch written twice (possible only without exactly-once's version check) adds nothing
        many("DELETE FROM partials WHERE computation = ? AND key = ? AND window_end = ? AND batch < ?",
             [(c.computation, k, w, c.batch) for c in commits for k, w in c.partial_deletes])
        many("INSERT INTO partials VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(computation, key, window_end, batch) DO NOTHING",
             [(c.computation, k, w, c.batch, c.shard, v) for c in commits for k, w, v in c.partial_writes])
        step("timers")
        many("DELETE FROM timers WHERE computation = ? AND key = ? AND tag = ?",
             [(c.computation, k, t) for c in commits for k, t in c.timer_deletes])
        many("INSERT INTO timers VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(computation, key, tag) DO UPDATE "
             "SET shard = excluded.shard, domain = excluded.domain, timestamp = excluded.timestamp",
             [(c.computation, t.key, t.tag, c.shard, t.domain, t.timestamp) for c in commits for t in c.timer_sets])
        step("seen_ids")
        # an id its own commit forgets is not written at all: the forgetting deletes below may go in
        # one statement with these inserts (``_together``), and would not see their rows
        many("INSERT INTO seen_ids VALUES (?, ?, ?, ?) ON CONFLICT(computation, shard, id) DO NOTHING",
             [(c.computation, c.shard, i, ts) for c in commits for i, ts in c.seen_ids if _kept(c, ts)])
        # a range's low is an id new to the shard when written: another range has it only as a copy
        many("INSERT INTO seen_ranges VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(computation, shard, prefix, low) "
             "DO NOTHING", [(c.computation, c.shard, *r) for c in commits for r in c.seen_ranges if _kept(c, r.newest)])
        self._forget_ids(commits)
        step("productions")
        self._insert_segments(EncodedSegments([r for e in encoded if e is not None for r in e.segments],
                                              [r for e in encoded if e is not None for r in e.routes]))

    def _write_versions(self, commits: Sequence[ShardCommit]) -> None:
        """Each commit's positions, version and watermarks, and its interval's journal row."""
        self._xmany("INSERT INTO positions VALUES (?, ?, ?, ?) ON CONFLICT(computation, shard, producer) "
                    "DO UPDATE SET batch = excluded.batch",
                    [(c.computation, c.shard, p, b) for c in commits for p, b in sorted((c.positions or {}).items())])
        self._step("version")
        self._advance_versions(commits)
        self._journal_intervals([c for c in commits if not c.productions_after_state])

    def _forget_ids(self, commits: Sequence[ShardCommit]) -> None:
        """Seen ids older than each commit's ``forget_ids_before``: one statement per table for
        all the commits, a condition per computation and threshold (a group's intervals share
        their watermark, so usually one per computation). A pass over three computations sent
        six statements here before, a third of its round trips on PostgreSQL."""
        by_threshold: dict[tuple[str, int], list[int]] = {}
        for c in commits:
            if c.forget_ids_before is not None:
                by_threshold.setdefault((c.computation, c.forget_ids_before), []).append(c.shard)
        if not by_threshold:
            return
        conditions, params = [], []
        for (computation, before), shards in sorted(by_threshold.items()):
            condition, param = self._in_list("shard", sorted(shards))
            conditions.append(f"(computation = ? AND {condition} AND {{age}} < ?)")
            params += [computation, param, before]
        where = " OR ".join(conditions)
        self._write(f"DELETE FROM seen_ids WHERE {where.format(age='timestamp')}", params)
        self._write(f"DELETE FROM seen_ranges WHERE {where.format(age='newest')}", params)

    def _advance_versions(self, commits: Sequence[ShardCommit]) -> None:
        """Each interval's version and watermarks, in one statement per kind: exactly-once moves
        the version from the batch's base to the batch (``_refusals`` checked the base, under the
        row's lock), at-least-once never moves anything back."""
        g = self.GREATEST
        # a VALUES list's columns are column1, column2, … in both dialects: computation, shard,
        # batch, input watermark, output watermark, base version (NULL: at-least-once)
        kinds: list[tuple[str, Callable[[ShardCommit], tuple[Any, ...]], list[ShardCommit]]] = [
            ("version = v.column3, input_watermark = v.column4",
             lambda c: (c.computation, c.shard, c.batch, c.input_watermark, c.output_watermark, c.base_version),
             [c for c in commits if c.exactly_once]),
            (f"version = {g}(shards.version, v.column3), input_watermark = {g}(shards.input_watermark, v.column4)",
             lambda c: (c.computation, c.shard, c.batch, c.input_watermark, c.output_watermark, None),
             [c for c in commits if not c.exactly_once]),
        ]
        for assignments, row_of, of_kind in kinds:
            if not of_kind:
                continue
            row = "(?, CAST(? AS BIGINT), CAST(? AS BIGINT), CAST(? AS BIGINT), CAST(? AS BIGINT), CAST(? AS BIGINT))"
            cur = self._x(
                f"UPDATE shards SET {assignments}, output_watermark = {g}(shards.output_watermark, v.column5) "
                f"FROM (VALUES {', '.join([row] * len(of_kind))}) AS v WHERE shards.computation = v.column1 AND "
                "shards.shard = v.column2 AND (v.column6 IS NULL OR shards.version = v.column6)",
                [x for c in of_kind for x in row_of(c)])
            if cur.rowcount != len(of_kind):  # each row was locked and checked: only a bug gets here
                raise StoreError(f"{len(of_kind) - cur.rowcount} of {len(of_kind)} interval versions did not move",
                                 got=[(c.computation, c.shard, c.batch) for c in of_kind],
                                 hint="report this: the intervals' rows were locked and checked in this transaction")

    def _journal_intervals(self, commits: Sequence[ShardCommit]) -> None:
        """An interval's commit is a batch of its producer on the bus: its journal rows."""
        now = self.now()
        self._xmany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(c.journal_as, c.batch, c.input_watermark, c.output_watermark, now,
                      c.routing.plan if c.routing else None, c.routing.since if c.routing else None)
                     for c in commits if c.journal_as is not None])

    def _write_counters(self, commits: Sequence[ShardCommit]) -> None:
        """The commits' counters, summed per computation and name, in one statement, its rows
        sorted: writers that commit at once take the counter rows' locks in one order. A worker's
        pass writes them last: a computation's counter rows are shared by every worker, and a row
        written earlier stayed locked for the rest of the pass, so the other workers' passes queued
        behind it (on PostgreSQL: 0.6-0.8 ms a pass on average, up to 35 ms, at 2,000 records/s
        through three stages on two workers). On PostgreSQL ``_xmany`` sends the rows as one
        statement, in their order."""
        self._step("counters")
        counters: dict[tuple[str, str], int] = {}
        for c in commits:
            for name, value in c.counters.items():
                counters[(c.computation, name)] = counters.get((c.computation, name), 0) + value
        self._xmany("INSERT INTO counters VALUES (?, ?, ?) ON CONFLICT(computation, name) DO UPDATE "
                    "SET value = counters.value + excluded.value",
                    [(computation, name, v) for (computation, name), v in sorted(counters.items())])


def _kept(c: ShardCommit, timestamp: int) -> bool:
    """Whether a seen id (or range) of ``c`` at ``timestamp`` outlives ``c``'s own forgetting."""
    return c.forget_ids_before is None or timestamp >= c.forget_ids_before


def _refusal(c: ShardCommit, row: tuple[int, int] | None) -> StoreError | None:
    """Why the store refuses ``c`` given its interval's (sequencer, version), or None."""
    sequencer = row[0] if row is not None else 0
    if sequencer != c.sequencer:
        hint = (f"a newer owner took interval {c.shard} of this computation; this worker drops it and goes on"
                if c.journal_as else
                "a newer driver took over this computation; this process is a zombie and must stop")
        return FencedWriterError(
            f"Writer of {c.computation!r} with sequencer {c.sequencer} was fenced off: the store's sequencer is "
            f"{sequencer}", got=c.sequencer, hint=hint)
    if row is None or (c.exactly_once and row[1] != c.base_version):
        return StaleBatchError(
            f"Shard {c.shard} of {c.computation!r} moved from version {c.base_version} to "
            f"{row[1] if row else None} while batch {c.batch} ran", got=c.batch,
            hint="another attempt committed first; this attempt's outcome is discarded, re-read the shard")
    return None
