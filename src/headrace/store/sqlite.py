"""The embedded default store: one SQLite file, no server (WAL mode, one transaction per shard batch)."""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any, Sequence

from .base import Failpoint
from .sql import SQLStore

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
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
"""


class SQLiteStore(SQLStore):
    """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``.

    ``BEGIN IMMEDIATE`` takes the database's one write lock, so writers are serialized whole.
    """

    BEGIN_WRITE = "BEGIN IMMEDIATE"
    BEGIN_READ = "BEGIN"
    FOR_SHARE = ""
    GREATEST = "MAX"

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

    def _x(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, params)

    def _xmany(self, sql: str, rows: list[tuple]) -> None:
        if rows:
            self._db.executemany(sql, rows)

    def _in_transaction(self) -> bool:
        return self._db.in_transaction

    def _in_list(self, column: str, values: list[str]) -> tuple[str, Any]:
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(values)

    def close(self) -> None:
        self._db.close()
