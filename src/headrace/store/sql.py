"""The store's logic in SQL that SQLite and PostgreSQL both speak; each dialect supplies its
connection, its schema and the few phrases that differ (``SQLDialect``).

One shard's outcome for one batch is one transaction, conditional on the shard's version and the
writer's sequencer; the shard row is read ``FOR UPDATE`` where the database has row locks, so a
takeover (``acquire_writer``) waits for commits in flight and fences every later one.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..engine.batch import DueTimer, Production, ShardCommit, ShardSnapshot, id_sequence
from ..engine.ports import BatchInfo, SegmentColumns, StoredRecord
from ..errors import FencedWriterError, StaleBatchError, StoreError
from ..model import BEGINNING_OF_TIME
from ..schema import StreamSchema
from .base import Failpoint
from .intervals import IntervalQueries
from .monitoring import MonitorQueries
from .rescale import rescale
from .segments import encode_segment, segment_columns, segment_rows

__all__ = ["SQLStore"]

WEAK_SLOT = 1 << 20  # segment slots of weak-production resends: shard + k * WEAK_SLOT (shards < WEAK_SLOT)
BATCH_COLUMNS = "producer, batch, input_watermark, output_watermark, completed_at"


def _now() -> int:
    return int(time.time() * 1000)


class SQLStore(MonitorQueries, IntervalQueries):
    """Everything but the dialect. Subclasses set the class attributes and implement the hooks."""

    url: str
    failpoint: Failpoint | None
    BEGIN_WRITE = "BEGIN"
    BEGIN_READ = "BEGIN"
    FOR_SHARE = ""
    FOR_UPDATE = ""
    GREATEST = "MAX"

    # -- dialect hooks ------------------------------------------------------------------------------
    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:  # a cursor
        raise NotImplementedError

    def _xmany(self, sql: str, rows: list[tuple]) -> None:
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        raise NotImplementedError

    def _in_list(self, column: str, values: list[Any]) -> tuple[str, Any]:
        """A condition ``column IN values`` and its one parameter."""
        raise NotImplementedError

    def _values(self, column: str, values: list[str]) -> tuple[str, Any]:
        """A FROM item with one row per value, in a column named ``column``, and its one parameter."""
        raise NotImplementedError

    def _lock_producer(self, producer: str) -> None:
        """Serialize journal writes of one producer (no-op where BEGIN_WRITE already locks the database)."""

    def close(self) -> None:
        raise NotImplementedError

    @property
    def shown_url(self) -> str:
        """The URL as error messages show it (no password)."""
        return self.url

    # -- plumbing -------------------------------------------------------------------------------------
    def _step(self, name: str) -> None:
        if self.failpoint is not None:
            self.failpoint(name)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._x(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._x(sql, params).fetchall()

    def _transaction(self, begin: str | None = None) -> "_Transaction":
        """``with self._transaction():`` a write transaction; ``_transaction(self.BEGIN_READ)`` a snapshot."""
        return _Transaction(self, begin or self.BEGIN_WRITE)

    # -- writers --------------------------------------------------------------------------------
    def register(self, computation: str, shards: int) -> None:
        """Create ``computation`` with ``shards`` key shards, or, if it has another count, re-partition
        its keys to ``shards`` in this one transaction (``store/rescale.py``)."""
        if type(shards) is not int or shards < 1 or shards >= WEAK_SLOT:
            raise StoreError(f"Computation {computation!r} needs a whole number of shards from 1 to {WEAK_SLOT - 1}",
                             got=shards, hint="pass shards=N with N >= 1, e.g. shards=4")
        with self._transaction():
            self._x("INSERT INTO computations(name, shards) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                    (computation, shards))
            row = self._one(f"SELECT shards FROM computations WHERE name = ?{self.FOR_UPDATE}", (computation,))
            if row[0] != shards:
                rescale(self, computation, int(row[0]), shards)
                return
            self._xmany("INSERT INTO shards(computation, shard, version, input_watermark, output_watermark) "
                        "VALUES (?, ?, 0, ?, ?) ON CONFLICT(computation, shard) DO NOTHING",
                        [(computation, s, BEGINNING_OF_TIME, BEGINNING_OF_TIME) for s in range(shards)])

    def _next_sequencer(self, computation: str) -> int:
        row = self._one("UPDATE computations SET sequencer = sequencer + 1 WHERE name = ? RETURNING sequencer",
                        (computation,))
        if row is None:
            raise StoreError(f"Computation {computation!r} is not registered in {self.shown_url}", got=computation,
                             hint="call store.register(name, shards) first")
        return int(row[0])

    def acquire_writer(self, computation: str) -> int:
        """Become the one writer of ``computation`` and of all its shards: every older writer's
        commits are refused from now on."""
        with self._transaction():
            sequencer = self._next_sequencer(computation)
            self._x("UPDATE shards SET sequencer = ?, owner = NULL, lease_until = 0 WHERE computation = ?",
                    (sequencer, computation))
        return sequencer

    def latest_batches(self, producers: list[str]) -> dict[str, int]:
        """The last batch each producer journaled (absent: none yet), in one query: one index
        seek per producer (a ``GROUP BY`` over the journal would read every batch it ever had)."""
        if not producers:
            return {}
        values, param = self._values("p", producers)
        return {p: int(b) for p, b in self._all(
            f"SELECT p, (SELECT MAX(batch) FROM batches WHERE producer = p) FROM {values}", (param,)) if b is not None}

    def sequencer(self, computation: str) -> int:
        row = self._one("SELECT sequencer FROM computations WHERE name = ?", (computation,))
        return int(row[0]) if row else 0

    def _check_shard_sequencer(self, c: ShardCommit) -> None:
        row = self._one(f"SELECT sequencer FROM shards WHERE computation = ? AND shard = ?{self.FOR_UPDATE}",
                        (c.computation, c.shard))
        current = int(row[0]) if row else 0
        if current != c.sequencer:
            hint = (f"a newer owner took interval {c.shard} of this computation; this worker drops it and goes on"
                    if c.journal_as else
                    "a newer driver took over this computation; this process is a zombie and must stop")
            raise FencedWriterError(
                f"Writer of {c.computation!r} with sequencer {c.sequencer} was fenced off: the store's sequencer is "
                f"{current}", got=c.sequencer, hint=hint)

    def _check_sequencer(self, computation: str, sequencer: int) -> None:
        row = self._one(f"SELECT sequencer FROM computations WHERE name = ?{self.FOR_SHARE}", (computation,))
        current = int(row[0]) if row else 0
        if current != sequencer:
            raise FencedWriterError(
                f"Writer of {computation!r} with sequencer {sequencer} was fenced off: the store's sequencer is {current}",
                got=sequencer,
                hint="a newer driver took over this computation; this process is a zombie and must stop",
            )

    # -- one shard batch --------------------------------------------------------------------------
    def load_shard(self, computation: str, shard: int, keys: list[str], watermark: int, wall_clock: int) -> ShardSnapshot:
        with self._transaction(self.BEGIN_READ):
            row = self._one("SELECT version, output_watermark FROM shards WHERE computation = ? AND shard = ?",
                            (computation, shard))
            if row is None:
                raise StoreError(f"Shard {shard} of {computation!r} does not exist in {self.shown_url}", got=shard,
                                 hint="register the computation with enough shards first")
            due = [DueTimer(*r) for r in self._all(
                "SELECT key, tag, domain, timestamp FROM timers WHERE computation = ? AND shard = ? AND "
                "((domain = 'watermark' AND timestamp <= ?) OR (domain = 'wall' AND timestamp <= ?)) "
                "ORDER BY timestamp", (computation, shard, watermark, wall_clock))]
            wanted = list(dict.fromkeys([*keys, *(t.key for t in due)]))
            states: dict[str, bytes] = {}
            if wanted:
                condition, param = self._in_list("key", wanted)
                states = dict(self._all(
                    f"SELECT key, value FROM state WHERE computation = ? AND {condition}", (computation, param)))
        return ShardSnapshot(version=row[0], states=states, due_timers=due, output_watermark=row[1])

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

    def all_seen_ids(self, computation: str, shard: int) -> Iterable[str]:
        return [r[0] for r in self._all("SELECT id FROM seen_ids WHERE computation = ? AND shard = ?",
                                        (computation, shard))]

    def shards_with_due_timers(self, computation: str, watermark: int, wall_clock: int) -> list[int]:
        return [r[0] for r in self._all(
            "SELECT DISTINCT shard FROM timers WHERE computation = ? AND "
            "((domain = 'watermark' AND timestamp <= ?) OR (domain = 'wall' AND timestamp <= ?)) ORDER BY shard",
            (computation, watermark, wall_clock))]

    def oldest_watermark_timer(self, computation: str) -> int | None:
        """The timestamp of the computation's oldest pending watermark timer, if any."""
        row = self._one("SELECT MIN(timestamp) FROM timers WHERE computation = ? AND domain = 'watermark'",
                        (computation,))
        return None if row[0] is None else int(row[0])

    def next_wall_timer(self, computation: str) -> int | None:
        row = self._one("SELECT MIN(timestamp) FROM timers WHERE computation = ? AND domain = 'wall'", (computation,))
        return None if row[0] is None else int(row[0])

    def commit_shard(self, c: ShardCommit) -> None:
        """Write one shard's batch outcome atomically, if the shard is still at ``c.base_version``
        and ``c.sequencer`` is still the computation's writer."""
        step = self._step
        if not c.strong_productions and c.productions and c.journal_as is None:
            step("weak_productions")  # weak: productions go out first, in a transaction of their own
            with self._transaction():
                self._check_shard_sequencer(c)
                self._check_base_version(c)  # a stale attempt must not replace a committed batch's segments
                self._write_productions(c, resend=True)
        step("begin")
        with self._transaction():
            self._write_commit(c)
            step("before_commit")
        step("after_commit")
        self._write_output_after_state([c])

    def _write_output_after_state(self, commits: list[ShardCommit]) -> None:
        """At-most-once output: productions (and an interval's journal row, which makes them
        visible) go out once the state is committed; a crash in between loses them, and a retry
        finds the batch committed and re-delivers what was written, nothing."""
        after = [c for c in commits if c.productions_after_state]
        if not after:
            return
        self._step("output")
        with self._transaction():
            for c in after:
                self._write_productions(c)
                self._journal_interval(c)
        self._step("after_output")

    def commit_shards(self, commits: list[ShardCommit]) -> list[StoreError | None]:
        """Several key intervals' outcomes in one transaction (a continuous worker's pass: one
        write-lock wait and one commit instead of one per interval). Each is written whole or, when
        its own commit would be refused (fenced, stale), not at all while the others are written:
        the failure is returned in its place. Productions are written in the commit whether strong
        or weak: an interval's productions reach consumers through its journal row, which this
        commit writes, so sending weak ones ahead could not make them visible any sooner."""
        failures: list[StoreError | None] = [None] * len(commits)
        self._step("begin")
        with self._transaction():
            # in one order, so that two workers' passes take PostgreSQL's row locks without deadlocking
            for i in sorted(range(len(commits)), key=lambda i: (commits[i].computation, commits[i].shard)):
                self._x("SAVEPOINT interval_commit")
                try:
                    self._write_commit(commits[i])
                except (FencedWriterError, StaleBatchError) as exc:
                    self._x("ROLLBACK TO SAVEPOINT interval_commit")
                    failures[i] = exc
                self._x("RELEASE SAVEPOINT interval_commit")
            self._step("before_commit")
        self._step("after_commit")
        self._write_output_after_state([c for c, failure in zip(commits, failures) if failure is None])
        return failures

    def _write_commit(self, c: ShardCommit) -> None:
        step = self._step
        step("check_sequencer")
        self._check_shard_sequencer(c)
        step("state")
        self._xmany("INSERT INTO state VALUES (?, ?, ?) ON CONFLICT(computation, key) DO UPDATE SET value = excluded.value",
                    [(c.computation, k, v) for k, v in c.state_writes if v is not None])
        self._xmany("DELETE FROM state WHERE computation = ? AND key = ?",
                    [(c.computation, k) for k, v in c.state_writes if v is None])
        # monoid partials merge without reading: a delta row per (key, window) and batch; a
        # batch written twice (possible only without exactly-once's version check) adds nothing
        self._xmany("DELETE FROM partials WHERE computation = ? AND key = ? AND window_end = ? AND batch < ?",
                    [(c.computation, k, w, c.batch) for k, w in c.partial_deletes])
        self._xmany("INSERT INTO partials VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(computation, key, window_end, batch) DO NOTHING",
                    [(c.computation, k, w, c.batch, c.shard, v) for k, w, v in c.partial_writes])
        step("timers")
        self._xmany("DELETE FROM timers WHERE computation = ? AND key = ? AND tag = ?",
                    [(c.computation, k, t) for k, t in c.timer_deletes])
        self._xmany("INSERT INTO timers VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(computation, key, tag) DO UPDATE "
                    "SET shard = excluded.shard, domain = excluded.domain, timestamp = excluded.timestamp",
                    [(c.computation, t.key, t.tag, c.shard, t.domain, t.timestamp) for t in c.timer_sets])
        step("seen_ids")
        if c.seen_ids:
            self._xmany("INSERT INTO seen_ids VALUES (?, ?, ?, ?) ON CONFLICT(computation, shard, id) DO NOTHING",
                        [(c.computation, c.shard, i, ts) for i, ts in c.seen_ids])
        if c.forget_ids_before is not None:
            self._x("DELETE FROM seen_ids WHERE computation = ? AND shard = ? AND timestamp < ?",
                    (c.computation, c.shard, c.forget_ids_before))
        step("productions")
        if (c.strong_productions or c.journal_as is not None) and not c.productions_after_state:
            self._write_productions(c)
        step("counters")  # sorted: shards that commit at once take the counter rows' locks in one order
        self._xmany("INSERT INTO counters VALUES (?, ?, ?) ON CONFLICT(computation, name) "
                    "DO UPDATE SET value = counters.value + excluded.value",
                    [(c.computation, k, v) for k, v in sorted(c.counters.items())])
        if c.positions:
            self._xmany("INSERT INTO positions VALUES (?, ?, ?, ?) ON CONFLICT(computation, shard, producer) "
                        "DO UPDATE SET batch = excluded.batch",
                        [(c.computation, c.shard, p, b) for p, b in sorted(c.positions.items())])
        step("version")
        self._advance_version(c)
        if not c.productions_after_state:
            self._journal_interval(c)

    def _journal_interval(self, c: ShardCommit) -> None:
        if c.journal_as is not None:  # an interval's commit is a batch of its producer on the bus
            self._x("INSERT INTO batches VALUES (?, ?, ?, ?, ?)",
                    (c.journal_as, c.batch, c.input_watermark, c.output_watermark, _now()))

    def _write_productions(self, c: ShardCommit, resend: bool = False) -> None:
        """Strong: the batch's segment, in the shard's commit. Weak (``resend``): sent ahead of the
        commit and never taken back, so every attempt of the batch adds its own segment
        (slot ``shard + k * WEAK_SLOT``), as MillWheel's weak productions reach consumers before the
        checkpoint: a retried attempt sends again, and a non-deterministic one sends something else."""
        by_stream: dict[str, list[Production]] = {}
        for p in c.productions:
            by_stream.setdefault(p.stream, []).append(p)
        now = _now()
        rows = []
        for stream, ps in by_stream.items():
            slot = c.shard
            if resend:
                sent = self._one("SELECT COUNT(*) FROM segments WHERE stream = ? AND producer = ? AND batch = ? "
                                 "AND shard % ? = ?", (stream, c.producer, c.batch, WEAK_SLOT, c.shard))[0]
                slot += WEAK_SLOT * sent
            rows.append((stream, c.producer, c.batch, slot, len(ps), encode_segment(ps), now))
        self._put_segments(rows)

    def _put_segments(self, rows: list[tuple]) -> None:
        self._xmany("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(stream, producer, batch, shard) "
                    "DO UPDATE SET count = excluded.count, data = excluded.data, created_at = excluded.created_at", rows)

    def _advance_version(self, c: ShardCommit) -> None:
        g = self.GREATEST
        if c.exactly_once:
            cur = self._x(
                f"UPDATE shards SET version = ?, input_watermark = ?, output_watermark = {g}(output_watermark, ?) "
                "WHERE computation = ? AND shard = ? AND version = ?",
                (c.batch, c.input_watermark, c.output_watermark, c.computation, c.shard, c.base_version))
        else:
            cur = self._x(
                f"UPDATE shards SET version = {g}(version, ?), input_watermark = {g}(input_watermark, ?), "
                f"output_watermark = {g}(output_watermark, ?) WHERE computation = ? AND shard = ?",
                (c.batch, c.input_watermark, c.output_watermark, c.computation, c.shard))
        if cur.rowcount != 1:
            self._raise_stale(c)

    def _check_base_version(self, c: ShardCommit) -> None:
        if c.exactly_once:
            row = self._one("SELECT version FROM shards WHERE computation = ? AND shard = ?", (c.computation, c.shard))
            if row is None or row[0] != c.base_version:
                self._raise_stale(c)

    def _raise_stale(self, c: ShardCommit) -> None:
        row = self._one("SELECT version FROM shards WHERE computation = ? AND shard = ?", (c.computation, c.shard))
        raise StaleBatchError(
            f"Shard {c.shard} of {c.computation!r} moved from version {c.base_version} to {row[0] if row else None} "
            f"while batch {c.batch} ran",
            got=c.batch,
            hint="another attempt committed first; this attempt's outcome is discarded, re-read the shard",
        )

    def committed_productions(self, computation: str, shard: int, batch: int) -> list[Production]:
        out: list[Production] = []
        for stream, data in self._all("SELECT stream, data FROM segments WHERE producer = ? AND batch = ? AND shard = ?",
                                      (computation, batch, shard)):
            out.extend(Production(stream, *r) for r in segment_rows(data))
        out.sort(key=lambda p: id_sequence(p.id))
        return out

    # -- the bus and the watermark journal ----------------------------------------------------------
    def declare_stream(self, stream: str, *producers: str) -> None:
        """Record that ``producers`` write ``stream``, so readers know the stream before its first
        record (in one statement: a computation of 100,000 intervals is 100,000 producers)."""
        if producers:
            values, param = self._values("p", sorted(set(producers)))
            self._x(f"INSERT INTO streams SELECT ?, p FROM {values} WHERE true ON CONFLICT(stream, producer) DO NOTHING",
                    (stream, param))

    def streams(self) -> list[str]:
        """Every stream declared or written in this store."""
        return [r[0] for r in self._all("SELECT stream FROM streams UNION SELECT DISTINCT stream FROM segments "
                                        "ORDER BY 1")]

    def complete_batch(self, producer: str, batch: int, input_watermark: int, output_watermark: int,
                       sequencer: int | None = None) -> int:
        """Journal ``batch`` of ``producer`` as complete; returns the journaled (monotonic) output watermark."""
        with self._transaction():
            self._lock_producer(producer)
            if sequencer is not None:
                self._check_sequencer(producer, sequencer)
            prev = self._one("SELECT output_watermark, input_watermark, batch FROM batches WHERE producer = ? "
                             "ORDER BY batch DESC LIMIT 1", (producer,))
            if prev is not None and prev[2] >= batch:
                row = self._one("SELECT output_watermark FROM batches WHERE producer = ? AND batch = ?", (producer, batch))
                return int(row[0]) if row else int(prev[0])
            out = max(output_watermark, prev[0]) if prev else output_watermark
            inp = max(input_watermark, prev[1]) if prev else input_watermark
            self._x("INSERT INTO batches VALUES (?, ?, ?, ?, ?)", (producer, batch, inp, out, _now()))
            return out

    def latest_batch(self, producer: str) -> BatchInfo | None:
        row = self._one(f"SELECT {BATCH_COLUMNS} FROM batches WHERE producer = ? ORDER BY batch DESC LIMIT 1", (producer,))
        return BatchInfo(*row) if row else None

    def batch_info(self, producer: str, batch: int) -> BatchInfo | None:
        row = self._one(f"SELECT {BATCH_COLUMNS} FROM batches WHERE producer = ? AND batch = ?", (producer, batch))
        return BatchInfo(*row) if row else None

    def publish(self, producer: str, batch: int, records: dict[str, list[Production]], watermark: int,
                checkpoint: str | None = None, schemas: Mapping[str, StreamSchema] | None = None) -> None:
        """An injector's batch: its segments, its journal entry and its resume point, in one transaction.

        Publishing a batch that is already journaled does nothing, so an injector that crashed and
        replays from its last checkpoint never doubles a batch.
        """
        with self._transaction():
            self._lock_producer(producer)
            if self._one("SELECT 1 FROM batches WHERE producer = ? AND batch = ?", (producer, batch)):
                return
            prev = self.latest_batch(producer)
            if prev is not None and prev.batch >= batch:
                raise StaleBatchError(f"Injector {producer!r} is at batch {prev.batch}, past {batch}", got=batch,
                                      hint="resume from the checkpoint the store returns")
            now = _now()
            self._put_segments([(stream, producer, batch, 0, len(ps), encode_segment(ps, (schemas or {}).get(stream)), now)
                                for stream, ps in records.items() if ps])
            wm = max(watermark, prev.output_watermark) if prev else watermark
            self._x("INSERT INTO batches VALUES (?, ?, ?, ?, ?)", (producer, batch, wm, wm, now))
            self._x("INSERT INTO checkpoints VALUES (?, ?) ON CONFLICT(producer) DO UPDATE SET position = excluded.position",
                    (producer, checkpoint))

    def checkpoint(self, producer: str) -> str | None:
        row = self._one("SELECT position FROM checkpoints WHERE producer = ?", (producer,))
        return row[0] if row else None

    def batches(self, producer: str, after: int = 0) -> list[BatchInfo]:
        return [BatchInfo(*r) for r in self._all(
            f"SELECT {BATCH_COLUMNS} FROM batches WHERE producer = ? AND batch > ? ORDER BY batch", (producer, after))]

    def read_segments(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> Iterator[tuple[int, StoredRecord]]:
        for batch, seg in self.read_segment_columns(stream, producer, after_batch, upto_batch):
            for r in zip(seg.keys, seg.values, seg.timestamps, seg.ids):
                yield batch, StoredRecord(*r)

    def read_segment_columns(self, stream: str, producer: str, after_batch: int,
                             upto_batch: int) -> Iterator[tuple[int, SegmentColumns]]:
        for batch, _shard, data in self.segment_blobs(stream, producer, after_batch, upto_batch):
            yield batch, segment_columns(data)

    def journal_heads(self) -> list[BatchInfo]:
        """The latest journaled batch of every producer."""
        return [BatchInfo(*r) for r in self._all(
            f"SELECT {', '.join('b.' + c for c in BATCH_COLUMNS.split(', '))} FROM batches b JOIN "
            "(SELECT producer, MAX(batch) AS batch FROM batches GROUP BY producer) h "
            "ON b.producer = h.producer AND b.batch = h.batch ORDER BY b.producer")]

    def trim_segments(self, older_than_ms: int) -> int:
        """Retention: delete segments committed before ``older_than_ms``; returns how many went."""
        return int(self._x("DELETE FROM segments WHERE created_at < ?", (older_than_ms,)).rowcount)

    def batch_before(self, producer: str, time_ms: int) -> int:
        """The last batch ``producer`` completed before ``time_ms`` (0 if none): where a replay from a time starts."""
        row = self._one("SELECT MAX(batch) FROM batches WHERE producer = ? AND completed_at < ?", (producer, time_ms))
        return int(row[0] or 0)

    def stream_producers(self, stream: str) -> list[str]:
        return [r[0] for r in self._all("SELECT producer FROM streams WHERE stream = ? UNION "
                                        "SELECT DISTINCT producer FROM segments WHERE stream = ? ORDER BY 1",
                                        (stream, stream))]

    def segment_records(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> int:
        """How many records ``producer``'s segments on ``stream`` in (after, upto] hold."""
        row = self._one("SELECT SUM(count) FROM segments WHERE stream = ? AND producer = ? AND batch > ? AND batch <= ?",
                        (stream, producer, after_batch, upto_batch))
        return int(row[0] or 0)

    def segment_blobs(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> list[tuple[int, int, bytes]]:
        """Raw segments (batch, shard, Arrow IPC bytes) of ``producer`` on ``stream`` in (after, upto]."""
        return self._all(
            "SELECT batch, shard, data FROM segments WHERE stream = ? AND producer = ? AND batch > ? AND batch <= ? "
            "ORDER BY batch, shard", (stream, producer, after_batch, upto_batch))

    def put_meta(self, name: str, value: str) -> None:
        self._x("INSERT INTO meta VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value", (name, value))

    def get_meta(self, name: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE name = ?", (name,))
        return None if row is None else str(row[0])

    def metas(self, prefix: str) -> dict[str, str]:
        return {str(n): str(v) for n, v in self._all("SELECT name, value FROM meta WHERE name LIKE ? ORDER BY name",
                                                     (prefix.replace("%", r"\%") + "%",))}

    def instance_id(self) -> str:
        """A random id this store's database got when it was created: Spark checkpoints carry it, so
        checkpoints are never resumed against another (or a re-created) database."""
        with self._transaction():
            self._x("INSERT INTO meta VALUES ('instance', ?) ON CONFLICT(name) DO NOTHING", (uuid.uuid4().hex,))
            return str(self._one("SELECT value FROM meta WHERE name = 'instance'")[0])

    # -- reading back -------------------------------------------------------------------------------
    def state(self, computation: str, key: str) -> bytes | None:
        row = self._one("SELECT value FROM state WHERE computation = ? AND key = ?", (computation, key))
        return row[0] if row else None

    def timers(self, computation: str, key: str) -> list[DueTimer]:
        return [DueTimer(*r) for r in self._all(
            "SELECT key, tag, domain, timestamp FROM timers WHERE computation = ? AND key = ? ORDER BY timestamp, tag",
            (computation, key))]

    def counters(self, computation: str) -> dict[str, int]:
        return {k: int(v) for k, v in self._all("SELECT name, value FROM counters WHERE computation = ?", (computation,))}

    def shard_versions(self, computation: str) -> dict[int, int]:
        return {s: int(v) for s, v in self._all("SELECT shard, version FROM shards WHERE computation = ?", (computation,))}


class _Transaction:
    """``with store._transaction():`` BEGIN …; COMMIT on success, ROLLBACK on any exception (a kill included)."""

    def __init__(self, store: SQLStore, begin: str):
        self.store, self.begin = store, begin

    def __enter__(self) -> None:
        self.store._x(self.begin)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.store._x("COMMIT")
        elif self.store._in_transaction():
            self.store._x("ROLLBACK")
