"""The embedded default store: one SQLite file, no server (WAL mode, one transaction per shard batch)."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import time
from typing import Iterable, Iterator

import pyarrow as pa

from ..engine.batch import DueTimer, Production, ShardCommit, ShardSnapshot
from ..errors import FencedWriterError, StaleBatchError, StoreError
from ..model import BEGINNING_OF_TIME
from .base import BatchInfo, Failpoint, StoredRecord

__all__ = ["SQLiteStore"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS computations(
  name TEXT PRIMARY KEY, shards INTEGER NOT NULL, sequencer INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shards(
  computation TEXT, shard INTEGER, version INTEGER NOT NULL,
  input_watermark INTEGER NOT NULL, output_watermark INTEGER NOT NULL,
  PRIMARY KEY(computation, shard)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state(
  computation TEXT, key TEXT, value BLOB NOT NULL, PRIMARY KEY(computation, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timers(
  computation TEXT, key TEXT, tag TEXT, shard INTEGER NOT NULL, domain TEXT NOT NULL, timestamp INTEGER NOT NULL,
  PRIMARY KEY(computation, key, tag)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timers_due ON timers(computation, shard, domain, timestamp);
CREATE TABLE IF NOT EXISTS seen_ids(
  computation TEXT, shard INTEGER, id TEXT, timestamp INTEGER NOT NULL,
  PRIMARY KEY(computation, shard, id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS seen_ids_age ON seen_ids(computation, shard, timestamp);
CREATE TABLE IF NOT EXISTS segments(
  stream TEXT, producer TEXT, batch INTEGER, shard INTEGER, count INTEGER NOT NULL,
  data BLOB NOT NULL, created_at INTEGER NOT NULL,
  PRIMARY KEY(stream, producer, batch, shard)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS segments_by_batch ON segments(producer, batch, shard);
CREATE TABLE IF NOT EXISTS batches(
  producer TEXT, batch INTEGER, input_watermark INTEGER NOT NULL, output_watermark INTEGER NOT NULL,
  completed_at INTEGER NOT NULL, PRIMARY KEY(producer, batch)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints(producer TEXT PRIMARY KEY, position TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters(
  computation TEXT, name TEXT, value INTEGER NOT NULL, PRIMARY KEY(computation, name)) WITHOUT ROWID;
"""


WEAK_SLOT = 1 << 20  # segment slots of weak-production resends: shard + k * WEAK_SLOT (shards < WEAK_SLOT)


def _now() -> int:
    return int(time.time() * 1000)


SEGMENT_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary()), ("timestamp", pa.int64()), ("id", pa.string())])


def _encode(records: list[Production]) -> bytes:
    """A segment is an Arrow IPC stream; values are pickled one by one so readers can pass them on untouched."""
    dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
    table = pa.table({
        "key": pa.array([p.key for p in records], pa.string()),
        "value": pa.array([dumps(p.value, proto) for p in records], pa.binary()),
        "timestamp": pa.array([p.timestamp for p in records], pa.int64()),
        "id": pa.array([p.id for p in records], pa.string()),
    }, schema=SEGMENT_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SEGMENT_SCHEMA) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_segment(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _decode(data: bytes) -> list[tuple]:
    t = decode_segment(data)
    loads = pickle.loads
    return list(zip(t.column("key").to_pylist(), map(loads, t.column("value").to_pylist()),
                    t.column("timestamp").to_pylist(), t.column("id").to_pylist()))


class SQLiteStore:
    """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``."""

    def __init__(self, path: str, *, synchronous: str = "NORMAL", failpoint: Failpoint | None = None):
        self.path = os.path.abspath(path)
        self.url = f"sqlite:///{self.path}"
        self.failpoint = failpoint
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=60, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 60000")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute(f"PRAGMA synchronous = {synchronous}")
        self._db.executescript(SCHEMA)

    def _step(self, name: str) -> None:
        if self.failpoint is not None:
            self.failpoint(name)

    # -- writers --------------------------------------------------------------------------------

    def register(self, computation: str, shards: int) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT shards FROM computations WHERE name = ?", (computation,)).fetchone()
            if row is None:
                db.execute("INSERT INTO computations(name, shards) VALUES (?, ?)", (computation, shards))
                db.executemany(
                    "INSERT OR IGNORE INTO shards VALUES (?, ?, 0, ?, ?)",
                    [(computation, s, BEGINNING_OF_TIME, BEGINNING_OF_TIME) for s in range(shards)],
                )
            elif row[0] != shards:
                raise StoreError(
                    f"Computation {computation!r} was created with {row[0]} shards in {self.url}",
                    got=shards,
                    hint=f"keep shards={row[0]}, or give the changed computation a new name",
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def acquire_writer(self, computation: str) -> int:
        """Become the one writer of ``computation``: every older writer's commits are refused from now on."""
        row = self._db.execute(
            "UPDATE computations SET sequencer = sequencer + 1 WHERE name = ? RETURNING sequencer", (computation,)
        ).fetchone()
        if row is None:
            raise StoreError(f"Computation {computation!r} is not registered in {self.url}", got=computation,
                             hint="call store.register(name, shards) first")
        return int(row[0])

    def sequencer(self, computation: str) -> int:
        row = self._db.execute("SELECT sequencer FROM computations WHERE name = ?", (computation,)).fetchone()
        return int(row[0]) if row else 0

    # -- one shard batch --------------------------------------------------------------------------

    def load_shard(self, computation: str, shard: int, keys: list[str], watermark: int, wall_clock: int) -> ShardSnapshot:
        db = self._db
        db.execute("BEGIN")
        try:
            row = db.execute(
                "SELECT version, output_watermark FROM shards WHERE computation = ? AND shard = ?", (computation, shard)
            ).fetchone()
            if row is None:
                raise StoreError(f"Shard {shard} of {computation!r} does not exist in {self.url}", got=shard,
                                 hint="register the computation with enough shards first")
            due = [DueTimer(*r) for r in db.execute(
                "SELECT key, tag, domain, timestamp FROM timers WHERE computation = ? AND shard = ? AND "
                "((domain = 'watermark' AND timestamp <= ?) OR (domain = 'wall' AND timestamp <= ?)) "
                "ORDER BY timestamp", (computation, shard, watermark, wall_clock))]
            wanted = list(dict.fromkeys([*keys, *(t.key for t in due)]))
            states = dict(db.execute(
                "SELECT key, value FROM state WHERE computation = ? AND key IN (SELECT value FROM json_each(?))",
                (computation, json.dumps(wanted)),
            )) if wanted else {}
        finally:
            db.execute("COMMIT")
        return ShardSnapshot(version=row[0], states=states, due_timers=due, output_watermark=row[1])

    def seen_ids(self, computation: str, shard: int, ids: list[str]) -> set[str]:
        return {r[0] for r in self._db.execute(
            "SELECT id FROM seen_ids WHERE computation = ? AND shard = ? AND id IN (SELECT value FROM json_each(?))",
            (computation, shard, json.dumps(ids)))}

    def all_seen_ids(self, computation: str, shard: int) -> Iterable[str]:
        return [r[0] for r in self._db.execute(
            "SELECT id FROM seen_ids WHERE computation = ? AND shard = ?", (computation, shard))]

    def shards_with_due_timers(self, computation: str, watermark: int, wall_clock: int) -> list[int]:
        return [r[0] for r in self._db.execute(
            "SELECT DISTINCT shard FROM timers WHERE computation = ? AND "
            "((domain = 'watermark' AND timestamp <= ?) OR (domain = 'wall' AND timestamp <= ?)) ORDER BY shard",
            (computation, watermark, wall_clock))]

    def watermark_holds(self, computation: str) -> list[int]:
        """The oldest pending watermark timer of the computation, if any: work that holds its output watermark."""
        row = self._db.execute("SELECT MIN(timestamp) FROM timers WHERE computation = ? AND domain = 'watermark'",
                               (computation,)).fetchone()
        return [] if row[0] is None else [int(row[0])]

    def next_wall_timer(self, computation: str) -> int | None:
        row = self._db.execute("SELECT MIN(timestamp) FROM timers WHERE computation = ? AND domain = 'wall'",
                               (computation,)).fetchone()
        return None if row[0] is None else int(row[0])

    def commit_shard(self, c: ShardCommit) -> None:
        """Write one shard's batch outcome atomically, if the shard is still at ``c.base_version``
        and ``c.sequencer`` is still the computation's writer."""
        db, step = self._db, self._step
        if not c.strong_productions and c.productions:
            step("weak_productions")  # weak: productions go out first, in a transaction of their own
            db.execute("BEGIN IMMEDIATE")
            try:
                self._check_sequencer(c)
                self._check_base_version(c)  # a stale attempt must not replace a committed batch's segments
                self._write_productions(c, resend=True)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        step("begin")
        db.execute("BEGIN IMMEDIATE")
        try:
            step("check_sequencer")
            self._check_sequencer(c)
            step("state")
            db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?, ?)",
                           [(c.computation, k, v) for k, v in c.state_writes if v is not None])
            db.executemany("DELETE FROM state WHERE computation = ? AND key = ?",
                           [(c.computation, k) for k, v in c.state_writes if v is None])
            step("timers")
            db.executemany("DELETE FROM timers WHERE computation = ? AND key = ? AND tag = ?",
                           [(c.computation, k, t) for k, t in c.timer_deletes])
            db.executemany("INSERT OR REPLACE INTO timers VALUES (?, ?, ?, ?, ?, ?)",
                           [(c.computation, t.key, t.tag, c.shard, t.domain, t.timestamp) for t in c.timer_sets])
            step("seen_ids")
            if c.seen_ids:
                db.executemany("INSERT OR IGNORE INTO seen_ids VALUES (?, ?, ?, ?)",
                               [(c.computation, c.shard, i, ts) for i, ts in c.seen_ids])
            if c.forget_ids_before is not None:
                db.execute("DELETE FROM seen_ids WHERE computation = ? AND shard = ? AND timestamp < ?",
                           (c.computation, c.shard, c.forget_ids_before))
            step("productions")
            if c.strong_productions:
                self._write_productions(c)
            step("counters")
            db.executemany(
                "INSERT INTO counters VALUES (?, ?, ?) ON CONFLICT(computation, name) DO UPDATE SET value = value + excluded.value",
                [(c.computation, k, v) for k, v in c.counters.items()])
            step("version")
            self._advance_version(c)
            step("before_commit")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        step("after_commit")

    def _check_sequencer(self, c: ShardCommit) -> None:
        current = self.sequencer(c.computation)
        if current != c.sequencer:
            raise FencedWriterError(
                f"Writer of {c.computation!r} with sequencer {c.sequencer} was fenced off: the store's sequencer is {current}",
                got=c.sequencer,
                hint="a newer driver took over this computation; this process is a zombie and must stop",
            )

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
                sent = self._db.execute(
                    "SELECT COUNT(*) FROM segments WHERE stream = ? AND producer = ? AND batch = ? AND shard % ? = ?",
                    (stream, c.computation, c.batch, WEAK_SLOT, c.shard)).fetchone()[0]
                slot += WEAK_SLOT * sent
            rows.append((stream, c.computation, c.batch, slot, len(ps), _encode(ps), now))
        self._db.executemany("INSERT OR REPLACE INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)", rows)

    def _advance_version(self, c: ShardCommit) -> None:
        if c.exactly_once:
            cur = self._db.execute(
                "UPDATE shards SET version = ?, input_watermark = ?, output_watermark = MAX(output_watermark, ?) "
                "WHERE computation = ? AND shard = ? AND version = ?",
                (c.batch, c.input_watermark, c.output_watermark, c.computation, c.shard, c.base_version))
        else:
            cur = self._db.execute(
                "UPDATE shards SET version = MAX(version, ?), input_watermark = MAX(input_watermark, ?), "
                "output_watermark = MAX(output_watermark, ?) WHERE computation = ? AND shard = ?",
                (c.batch, c.input_watermark, c.output_watermark, c.computation, c.shard))
        if cur.rowcount != 1:
            self._raise_stale(c)

    def _check_base_version(self, c: ShardCommit) -> None:
        if c.exactly_once:
            row = self._db.execute("SELECT version FROM shards WHERE computation = ? AND shard = ?",
                                   (c.computation, c.shard)).fetchone()
            if row is None or row[0] != c.base_version:
                self._raise_stale(c)

    def _raise_stale(self, c: ShardCommit) -> None:
        row = self._db.execute("SELECT version FROM shards WHERE computation = ? AND shard = ?",
                               (c.computation, c.shard)).fetchone()
        raise StaleBatchError(
            f"Shard {c.shard} of {c.computation!r} moved from version {c.base_version} to {row[0] if row else None} "
            f"while batch {c.batch} ran",
            got=c.batch,
            hint="another attempt committed first; this attempt's outcome is discarded, re-read the shard",
        )

    def committed_productions(self, computation: str, shard: int, batch: int) -> list[Production]:
        out: list[Production] = []
        for stream, data in self._db.execute(
            "SELECT stream, data FROM segments WHERE producer = ? AND batch = ? AND shard = ?", (computation, batch, shard)
        ):
            out.extend(Production(stream, *r) for r in _decode(data))
        out.sort(key=lambda p: int(p.id.rsplit(":", 1)[1]))
        return out

    # -- the bus and the watermark journal ----------------------------------------------------------

    def append_segment(self, stream: str, producer: str, batch: int, shard: int, records: list[Production]) -> None:
        self._db.execute("INSERT OR REPLACE INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (stream, producer, batch, shard, len(records), _encode(records), _now()))

    def complete_batch(self, producer: str, batch: int, input_watermark: int, output_watermark: int,
                       sequencer: int | None = None) -> int:
        """Journal ``batch`` of ``producer`` as complete; returns the journaled (monotonic) output watermark."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if sequencer is not None:
                current = self.sequencer(producer)
                if current != sequencer:
                    raise FencedWriterError(
                        f"Writer of {producer!r} with sequencer {sequencer} was fenced off: the store's sequencer is {current}",
                        got=sequencer, hint="a newer driver took over this computation; this process must stop")
            prev = db.execute("SELECT output_watermark, input_watermark, batch FROM batches WHERE producer = ? "
                              "ORDER BY batch DESC LIMIT 1", (producer,)).fetchone()
            if prev is not None and prev[2] >= batch:
                db.execute("COMMIT")
                row = db.execute("SELECT output_watermark FROM batches WHERE producer = ? AND batch = ?",
                                 (producer, batch)).fetchone()
                return int(row[0]) if row else int(prev[0])
            out = max(output_watermark, prev[0]) if prev else output_watermark
            inp = max(input_watermark, prev[1]) if prev else input_watermark
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?)", (producer, batch, inp, out, _now()))
            db.execute("COMMIT")
            return out
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def latest_batch(self, producer: str) -> BatchInfo | None:
        row = self._db.execute(
            "SELECT producer, batch, input_watermark, output_watermark, completed_at FROM batches "
            "WHERE producer = ? ORDER BY batch DESC LIMIT 1", (producer,)).fetchone()
        return BatchInfo(*row) if row else None

    def batch_info(self, producer: str, batch: int) -> BatchInfo | None:
        row = self._db.execute(
            "SELECT producer, batch, input_watermark, output_watermark, completed_at FROM batches "
            "WHERE producer = ? AND batch = ?", (producer, batch)).fetchone()
        return BatchInfo(*row) if row else None

    def publish(self, producer: str, batch: int, records: dict[str, list[Production]], watermark: int,
                checkpoint: str | None = None) -> None:
        """An injector's batch: its segments, its journal entry and its resume point, in one transaction.

        Publishing a batch that is already journaled does nothing, so an injector that crashed and
        replays from its last checkpoint never doubles a batch.
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT 1 FROM batches WHERE producer = ? AND batch = ?", (producer, batch)).fetchone():
                db.execute("ROLLBACK")
                return
            prev = self.latest_batch(producer)
            if prev is not None and prev.batch >= batch:
                raise StaleBatchError(f"Injector {producer!r} is at batch {prev.batch}, past {batch}", got=batch,
                                      hint="resume from the checkpoint the store returns")
            now = _now()
            for stream, ps in records.items():
                if ps:
                    db.execute("INSERT OR REPLACE INTO segments VALUES (?, ?, ?, 0, ?, ?, ?)",
                               (stream, producer, batch, len(ps), _encode(ps), now))
            wm = max(watermark, prev.output_watermark) if prev else watermark
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?)", (producer, batch, wm, wm, now))
            db.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?)", (producer, checkpoint))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def checkpoint(self, producer: str) -> str | None:
        row = self._db.execute("SELECT position FROM checkpoints WHERE producer = ?", (producer,)).fetchone()
        return row[0] if row else None

    def batches(self, producer: str, after: int = 0) -> list[BatchInfo]:
        return [BatchInfo(*r) for r in self._db.execute(
            "SELECT producer, batch, input_watermark, output_watermark, completed_at FROM batches "
            "WHERE producer = ? AND batch > ? ORDER BY batch", (producer, after))]

    def read_segments(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> Iterator[tuple[int, StoredRecord]]:
        rows = self._db.execute(
            "SELECT batch, data FROM segments WHERE stream = ? AND producer = ? AND batch > ? AND batch <= ? "
            "ORDER BY batch, shard", (stream, producer, after_batch, upto_batch)).fetchall()
        for batch, data in rows:
            for r in _decode(data):
                yield batch, StoredRecord(*r)

    def journal_heads(self) -> list[BatchInfo]:
        """The latest journaled batch of every producer."""
        return [BatchInfo(*r) for r in self._db.execute(
            "SELECT producer, MAX(batch), input_watermark, output_watermark, completed_at FROM batches "
            "GROUP BY producer ORDER BY producer")]

    def trim_segments(self, older_than_ms: int) -> int:
        """Retention: delete segments committed before ``older_than_ms``; returns how many went."""
        return self._db.execute("DELETE FROM segments WHERE created_at < ?", (older_than_ms,)).rowcount

    def batch_before(self, producer: str, time_ms: int) -> int:
        """The last batch ``producer`` completed before ``time_ms`` (0 if none): where a replay from a time starts."""
        row = self._db.execute("SELECT MAX(batch) FROM batches WHERE producer = ? AND completed_at < ?",
                               (producer, time_ms)).fetchone()
        return int(row[0] or 0)

    def stream_producers(self, stream: str) -> list[str]:
        return [r[0] for r in self._db.execute(
            "SELECT DISTINCT producer FROM segments WHERE stream = ? ORDER BY producer", (stream,))]

    def segment_blobs(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> list[tuple[int, int, bytes]]:
        """Raw segments (batch, shard, Arrow IPC bytes) of ``producer`` on ``stream`` in (after, upto]."""
        return self._db.execute(
            "SELECT batch, shard, data FROM segments WHERE stream = ? AND producer = ? AND batch > ? AND batch <= ? "
            "ORDER BY batch, shard", (stream, producer, after_batch, upto_batch)).fetchall()

    # -- reading back -------------------------------------------------------------------------------

    def state(self, computation: str, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM state WHERE computation = ? AND key = ?", (computation, key)).fetchone()
        return row[0] if row else None

    def timers(self, computation: str, key: str) -> list[DueTimer]:
        return [DueTimer(*r) for r in self._db.execute(
            "SELECT key, tag, domain, timestamp FROM timers WHERE computation = ? AND key = ? ORDER BY timestamp, tag",
            (computation, key))]

    def counters(self, computation: str) -> dict[str, int]:
        return dict(self._db.execute("SELECT name, value FROM counters WHERE computation = ?", (computation,)))

    def shard_versions(self, computation: str) -> dict[int, int]:
        return dict(self._db.execute("SELECT shard, version FROM shards WHERE computation = ?", (computation,)))

    def close(self) -> None:
        self._db.close()
