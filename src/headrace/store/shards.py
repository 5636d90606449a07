"""One shard's batch in the store (docs/architecture.md §3.4-3.6): the shard's snapshot read at
the start of a batch, and its whole outcome written in one transaction, conditional on the
shard's version and the writer's sequencer; the shard row is read ``FOR UPDATE`` where the
database has row locks, so a takeover waits for commits in flight and fences every later one."""

from __future__ import annotations

from typing import Iterable, Sequence

from ..engine.batch import DueTimer, Production, QuietReport, ShardCommit, ShardSnapshot
from ..engine.seen import SeenRange, range_ids
from ..errors import StoreError
from ..names import id_sequence
from .bus import EncodedSegments
from .intervals import IntervalQueries
from .outcomes import OutcomeWrites
from .segments import PIECE_SLOT, segment_rows

__all__ = ["ShardQueries", "WEAK_SLOT"]

DUE_TIMER_PAIRS = 200  # (computation, watermark) pairs per statement of ``due_timer_shards``

WEAK_SLOT = 1 << 20  # segment slots of weak-production resends: shard + k * WEAK_SLOT (shards < WEAK_SLOT)


class ShardQueries(OutcomeWrites, IntervalQueries):
    """Shard snapshots and commits."""

    # -- one shard batch --------------------------------------------------------------------------
    def load_shard(self, computation: str, shard: int, keys: list[str], watermark: int, wall_clock: int,
                   tags: Sequence[str] = ()) -> ShardSnapshot:
        """The shard's version, the state of ``keys`` and of the keys with a due timer, the due
        timers, and the timers of ``keys`` tagged ``tags`` whether due or not (a state TTL's).

        With no keys to read (a continuous worker whose state cache holds them all), the row and its
        due timers come in one statement, a snapshot of its own, without a read transaction (one
        round trip instead of four on PostgreSQL); only when a timer is due is its state read, in
        the transaction below."""
        if not keys:  # no timer due: nothing else to read
            quiet = self.quiet_snapshots([(computation, shard, watermark)], wall_clock).get((computation, shard))
            if quiet is not None:
                return quiet
        with self._transaction(self.BEGIN_READ):
            row = self._one("SELECT version, output_watermark, sequencer FROM shards WHERE computation = ? AND "
                            "shard = ?", (computation, shard))
            if row is None:
                raise StoreError(f"Shard {shard} of {computation!r} does not exist in {self.shown_url}", got=shard,
                                 hint="register the computation with enough shards first")
            due = [DueTimer(*r) for r in self._all(
                "SELECT key, tag, domain, timestamp FROM timers WHERE computation = ? AND shard = ? AND "
                "((domain = 'watermark' AND timestamp <= ?) OR (domain = 'wall' AND timestamp <= ?)) "
                "ORDER BY timestamp", (computation, shard, watermark, wall_clock))]
            if tags and keys:
                known = {(t.key, t.tag) for t in due}
                key_in, key_param = self._in_list("key", list(keys))
                tag_in, tag_param = self._in_list("tag", list(tags))
                due += [t for t in (DueTimer(*r) for r in self._all(
                    f"SELECT key, tag, domain, timestamp FROM timers WHERE computation = ? AND shard = ? AND {key_in} "
                    f"AND {tag_in}", (computation, shard, key_param, tag_param))) if (t.key, t.tag) not in known]
            wanted = list(dict.fromkeys([*keys, *(t.key for t in due)]))
            states: dict[str, bytes] = {}
            if wanted:
                condition, param = self._in_list("key", wanted)
                states = dict(self._all(
                    f"SELECT key, value FROM state WHERE computation = ? AND {condition}", (computation, param)))
        return ShardSnapshot(version=row[0], states=states, due_timers=due, output_watermark=row[1], sequencer=row[2])

    def quiet_snapshots(self, wanted: Sequence[tuple[str, int, int]], wall_clock: int) -> dict[tuple[str, int], ShardSnapshot]:
        """For each (computation, shard, watermark) with no timer due at that watermark and
        ``wall_clock``, the snapshot ``load_shard`` gives with no keys to read (version, output
        watermark, sequencer), all in one statement: a pass reads its active intervals' rows at
        once. An interval with a due timer is left out (``load_shard`` reads its timers' state)."""
        if not wanted:
            return {}
        table, param = self._ranges(list(wanted))
        rows = self._all(
            "SELECT p, lo, s.version, s.output_watermark, s.sequencer FROM "
            f"{self._per_range(table, 'shards s', 's.computation = p AND s.shard = lo')} WHERE NOT EXISTS "
            "(SELECT 1 FROM timers t WHERE t.computation = p AND t.shard = lo AND "
            "((t.domain = 'watermark' AND t.timestamp <= hi) OR (t.domain = 'wall' AND t.timestamp <= ?)))",
            (param, wall_clock))
        return {(str(c), int(shard)): ShardSnapshot(version=version, states={}, due_timers=[],
                                                    output_watermark=output_watermark, sequencer=sequencer)
                for c, shard, version, output_watermark, sequencer in rows}

    def load_partials(self, computation: str, shard: int,
                      windows: list[tuple[str, int]] | None) -> dict[tuple[str, int], list[bytes]]:
        """A monoid computation's delta rows of these (key, window) pairs (every pair of the shard: None)."""
        if windows is None:
            rows = self._all("SELECT key, window_end, value FROM partials WHERE computation = ? AND shard = ?",
                             (computation, shard))
        else:
            condition, param = self._in_list("key", sorted({k for k, _ in windows}))
            rows = self._all(f"SELECT key, window_end, value FROM partials WHERE computation = ? AND {condition}",
                             (computation, param))
        wanted = None if windows is None else set(windows)
        out: dict[tuple[str, int], list[bytes]] = {}
        for key, window, value in rows:
            if wanted is None or (key, window) in wanted:
                out.setdefault((key, int(window)), []).append(bytes(value))
        return out

    def seen_ids(self, computation: str, shard: int, ids: list[str]) -> set[str]:
        condition, param = self._in_list("id", ids)
        return {r[0] for r in self._all(
            f"SELECT id FROM seen_ids WHERE computation = ? AND shard = ? AND {condition}", (computation, shard, param))}

    def exact_seen_ids(self, computation: str, shard: int) -> Iterable[str]:
        return [r[0] for r in self._all("SELECT id FROM seen_ids WHERE computation = ? AND shard = ?",
                                        (computation, shard))]

    def seen_ranges(self, computation: str, shard: int, prefix: str, low: int, high: int) -> list[SeenRange]:
        return [SeenRange(p, int(lo), int(hi), int(n), bytes(b)) for p, lo, hi, n, b in self._all(
            "SELECT prefix, low, high, newest, bits FROM seen_ranges WHERE computation = ? AND shard = ? AND "
            "prefix = ? AND low <= ? AND high >= ?", (computation, shard, prefix, high, low))]

    def seen_range_extents(self, computation: str, shard: int) -> Iterable[tuple[str, int, int, int]]:
        return [(p, int(lo), int(hi), int(n)) for p, lo, hi, n in self._all(
            "SELECT prefix, low, high, newest FROM seen_ranges WHERE computation = ? AND shard = ?",
            (computation, shard))]

    def all_seen_ids(self, computation: str, shard: int) -> Iterable[str]:
        ranges = self._all("SELECT prefix, low, high, newest, bits FROM seen_ranges WHERE computation = ? AND "
                           "shard = ?", (computation, shard))
        return [*self.exact_seen_ids(computation, shard),
                *(i for p, lo, hi, n, b in ranges for i in range_ids(SeenRange(p, int(lo), int(hi), int(n), bytes(b))))]

    def shards_with_due_timers(self, computation: str, watermark: int, wall_clock: int) -> list[int]:
        """The shards with a due timer: two index ranges (watermark timers up to the watermark,
        wall timers up to the clock), however many timers are pending."""
        return self.due_timer_shards([(computation, watermark)], wall_clock)[0]

    def due_timer_shards(self, wanted: Sequence[tuple[str, int]], wall_clock: int) -> list[list[int]]:
        """``shards_with_due_timers`` of each (computation, watermark), in one statement."""
        out: list[list[int]] = [[] for _ in wanted]
        for at in range(0, len(wanted), DUE_TIMER_PAIRS):  # SQLite allows 500 terms in a compound SELECT
            chunk = wanted[at:at + DUE_TIMER_PAIRS]
            parts = [f"SELECT {at + i}, shard FROM timers WHERE computation = ? AND domain = 'watermark' AND "
                     f"timestamp <= ? UNION SELECT {at + i}, shard FROM timers WHERE computation = ? AND "
                     "domain = 'wall' AND timestamp <= ?" for i in range(len(chunk))]
            for i, shard in self._all(" UNION ".join(parts) + " ORDER BY 1, 2",
                                      [x for computation, watermark in chunk
                                       for x in (computation, watermark, computation, wall_clock)]):
                out[int(i)].append(int(shard))
        return out

    def next_wall_timer(self, computation: str, shards: list[int] | None = None) -> int | None:
        """The earliest wall timer of the computation (of these shards, when given)."""
        if shards is None:
            row = self._one("SELECT MIN(timestamp) FROM timers WHERE computation = ? AND domain = 'wall'",
                            (computation,))
        else:
            condition, param = self._in_list("shard", shards)
            row = self._one(f"SELECT MIN(timestamp) FROM timers WHERE computation = ? AND domain = 'wall' AND "
                            f"{condition}", (computation, param))
        return None if row[0] is None else int(row[0])

    def commit_shard(self, c: ShardCommit) -> None:
        """Write one shard's batch outcome atomically, if the shard is still at ``c.base_version``
        and ``c.sequencer`` is still the computation's writer."""
        step = self._step
        if not c.strong_productions and c.productions and c.journal_as is None:
            step("weak_productions")  # weak: productions go out first, in a transaction of their own
            with self._transaction():
                self._raise_refusal(c)  # a stale attempt must not replace a committed batch's segments
                self._resend_productions(c)
        encoded = self._encoded_in_commit(c)
        step("begin")
        with self._transaction():
            step("check_sequencer")
            self._raise_refusal(c)
            with self._together():  # on PostgreSQL two round trips: the writes ride on the version's update
                self._write_outcomes([c], [encoded])
                self._write_counters([c])
                self._write_versions([c])
            step("before_commit")
        step("after_commit")
        self._write_output_after_state([c])

    def _raise_refusal(self, c: ShardCommit) -> None:
        refusal = self._refusals([c])[0]
        if refusal is not None:
            raise refusal

    def _write_output_after_state(self, commits: list[ShardCommit], quiet: Sequence[QuietReport] = ()) -> None:
        """At-most-once output: productions (and an interval's journal row, which makes them
        visible) go out once the state is committed; a crash in between loses them, and a retry
        finds the batch committed and re-delivers what was written, nothing. ``quiet``: the
        pass's reports, which must not be seen before this output (a crash in between loses them
        too, and the next pass reports again)."""
        after = [c for c in commits if c.productions_after_state]
        if not after:
            return
        encoded = [self._encode_productions(c, c.shard) for c in after]
        self._step("output")
        with self._transaction():
            for e in encoded:
                self._insert_segments(e)
            self._journal_intervals(after)
            self.report_quiet(quiet)
        self._step("after_output")

    def commit_shards(self, commits: list[ShardCommit], quiet: Sequence[QuietReport] = ()) -> list[StoreError | None]:
        """Several key intervals' outcomes in one transaction (a continuous worker's pass: one
        write-lock wait and one commit instead of one per interval, and one statement per table
        instead of one per interval, ``outcomes.py``), with the pass's reports of its quiet
        intervals (``report_quiet``'s arguments). Each outcome is written whole or, when its own
        commit would be refused (fenced, stale), not at all while the others are written: the
        failure is returned in its place. Productions are written in the commit whether strong or
        weak: an interval's productions reach consumers through its journal row, which this commit
        writes, so sending weak ones ahead could not make them visible any sooner."""
        encoded = [self._encoded_in_commit(c) for c in commits]
        self._step("begin")
        with self._transaction():
            self._step("check_sequencer")
            failures = self._refusals(commits)
            made = [c for c, failure in zip(commits, failures) if failure is None]
            later = any(c.productions_after_state for c in made)
            with self._together():  # on PostgreSQL two round trips: the writes up to the versions' update, the rest
                self._write_outcomes(made, [e for e, failure in zip(encoded, failures) if failure is None])
                self._write_versions(made)
                # a report raises the watermark of every interval held under its sequencer: with
                # output still to go out after the state, it waits for that output
                self.report_quiet(() if later else quiet)
                self._write_counters(made)
            self._step("before_commit")
        self._step("after_commit")
        self._write_output_after_state(made, quiet if later else ())
        return failures

    def _encoded_in_commit(self, c: ShardCommit) -> EncodedSegments | None:
        """The productions a commit of ``c`` writes itself (strong ones, and those an interval
        journals as a producer's batch), encoded ahead of its transaction; None: it writes none."""
        if (c.strong_productions or c.journal_as is not None) and not c.productions_after_state:
            return self._encode_productions(c, c.shard)
        return None

    def _encode_productions(self, c: ShardCommit, slot: int) -> EncodedSegments:
        by_stream: dict[str, list[Production]] = {}
        for p in c.productions:
            by_stream.setdefault(p.stream, []).append(p)
        return self._encode_segments(c.producer, c.batch, slot, by_stream, {}, c.routing)

    def _resend_productions(self, c: ShardCommit) -> None:
        """Weak productions, sent ahead of the commit and never taken back, so every attempt of the
        batch adds its own segments (slot ``shard + k * WEAK_SLOT``), as MillWheel's weak
        productions reach consumers before the checkpoint: a retried attempt sends again, and a
        non-deterministic one sends something else."""
        streams = {p.stream for p in c.productions}
        sent = self._one("SELECT COUNT(*) FROM segments WHERE producer = ? AND batch = ? AND shard % ? = ? "
                         "AND shard < ? AND stream = ?",
                         (c.producer, c.batch, WEAK_SLOT, c.shard, PIECE_SLOT, min(streams)))[0]
        self._insert_segments(self._encode_productions(c, c.shard + WEAK_SLOT * int(sent)))

    def committed_productions(self, computation: str, shard: int, batch: int) -> list[Production]:
        out: list[Production] = []
        for stream, data in self._all("SELECT stream, data FROM segments WHERE producer = ? AND batch = ? "
                                      "AND shard % ? = ? ORDER BY shard", (computation, batch, PIECE_SLOT, shard)):
            out.extend(Production(stream, *r) for r in segment_rows(data))
        out.sort(key=lambda p: id_sequence(p.id))
        return out

