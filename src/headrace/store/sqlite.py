"""The embedded default store: one SQLite file, no server (WAL mode, one transaction per shard batch)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Callable, Sequence
from urllib.parse import quote

from ..errors import StoreError

from .connection import Failpoint
from .schema import schema_statements
from .sql import SQLStore
from .versions import check_schema

__all__ = ["SQLiteStore"]

WAL_KEEP_BYTES = 16 * 2**20
RECLAIM_WAIT_MS = 25
BUSY_TIMEOUT_S = 60
WRITE_LOCK_RETRY_S = 0.0003
IDLE_LOOK_S = 0.003


class SQLiteStore(SQLStore):
    """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``.

    ``BEGIN IMMEDIATE`` takes the database's one write lock, so writers are serialized whole.
    """

    BEGIN_WRITE = "BEGIN IMMEDIATE"
    BEGIN_READ = "BEGIN"
    FOR_SHARE = ""
    GREATEST = "MAX"

    def __init__(self, path: str, *, synchronous: str = "NORMAL", failpoint: Failpoint | None = None,
                 clock: Callable[[], int] | None = None, read_only: bool = False):
        self.path = os.path.abspath(path)
        self.url = f"sqlite:///{self.path}"
        self.failpoint = failpoint
        if clock is not None:
            self.clock = clock
        if read_only:  # a tool that only reads: never creates a store where a path was mistyped
            if not os.path.isfile(self.path):
                raise StoreError(f"No store at {self.path}", got=self.url,
                                 hint="check --store (sqlite:///relative/file.db or sqlite:////absolute/file.db): "
                                      "a run creates its store, the tools only read one")
            self._db = _read_only(self.path)
        else:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_S,
                                       check_same_thread=False)
        self._busy_timeout(BUSY_TIMEOUT_S)
        if not read_only:
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute(f"PRAGMA synchronous = {synchronous}")
            self._db.execute(f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}")
        try:
            check_schema(self, read_only)
        except BaseException:
            self._db.close()
            raise
        self._data_version = 0

    def _table_columns(self) -> dict[str, set[str]]:
        tables: dict[str, set[str]] = {}
        for table, column in self._db.execute("SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p "
                                              "WHERE m.type = 'table'"):
            tables.setdefault(table, set()).add(column)
        return tables

    def _create_schema(self) -> None:
        for statement in schema_statements("sqlite"):
            self._db.execute(statement)

    def _x(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, params)

    def _xmany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            self._db.executemany(sql, rows)

    def _in_transaction(self) -> bool:
        return self._db.in_transaction

    def _begin(self, begin: str) -> None:
        """``BEGIN IMMEDIATE`` retried every ``WRITE_LOCK_RETRY_S`` while another connection
        writes, up to ``BUSY_TIMEOUT_S``. SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20,
        25 ms ... between tries, so a writer that lost the lock a few times in a row slept 20 to
        25 ms after it was free again: the pipeline's tail latency, on a lock held a millisecond
        at a time. A statement outside a transaction keeps the busy handler (a trim's steps: so
        they yield to the pipeline's commits)."""
        if begin != self.BEGIN_WRITE:
            self._db.execute(begin)
            return
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        self._busy_timeout(0)
        try:
            while True:
                try:
                    self._db.execute(begin)
                    return
                except sqlite3.OperationalError as exc:
                    if not self._is_busy(exc) or time.monotonic() > deadline:
                        raise
                time.sleep(WRITE_LOCK_RETRY_S)
        finally:
            self._busy_timeout(BUSY_TIMEOUT_S)

    def _busy_timeout(self, seconds: float) -> None:
        """How long a statement waits in SQLite's busy handler for a lock another connection holds."""
        self._db.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")

    def _in_list(self, column: str, values: list[Any]) -> tuple[str, Any]:
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(values)

    def _values(self, column: str, values: list[str]) -> tuple[str, Any]:
        return f"(SELECT value AS {column} FROM json_each(?))", json.dumps(values)

    def _records(self, columns: str, rows: Sequence[Sequence[Any]]) -> tuple[str, Any]:
        names = [c.split()[0] for c in columns.split(",")]
        items = ", ".join(f"json_extract(value, '$[{i}]') AS {name}" for i, name in enumerate(names))
        return f"(SELECT {items} FROM json_each(?))", json.dumps([list(r) for r in rows])

    def _in_row_list(self, column: str, values: str) -> str:
        return f"{column} IN (SELECT value FROM json_each({values}))"

    def wait_for_commits(self, channels: Sequence[str], timeout_s: float) -> bool:
        """Until another connection commits (SQLite's ``data_version`` moves: no table is read), or
        ``timeout_s`` passes; looks every millisecond at first, backing off to every ``IDLE_LOOK_S``
        (a look reads the shared-memory header, microseconds: backing off to 10 ms made the first
        record after an idle spell wait up to 10 ms for the look that saw it)."""
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while True:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version:
                self._data_version = version
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, IDLE_LOOK_S)

    def _is_busy(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY

    def _between_steps(self, took_s: float) -> None:
        """SQLite has one writer at a time and no queue for its lock: the trim pauses as long as its
        step took (at least 2 ms, at most 50), so the pipeline's commits that waited for the lock
        meanwhile (retrying every ``WRITE_LOCK_RETRY_S``) go before its next step."""
        time.sleep(min(max(took_s, 0.002), 0.05))

    def _reclaim(self) -> None:
        """Truncate the write-ahead log after a trim. SQLite checkpoints it as it goes, but only
        rewinds it when no reader holds an older snapshot, which workers reading all the time
        rarely allow: the log then grows with the run (32 MB in two minutes at 500 records/s).
        A TRUNCATE checkpoint waits for the readers of the moment to finish, holding writers back
        meanwhile, so it waits at most ``RECLAIM_WAIT_MS`` (a wait of 100 ms every 10 s was 1 % of the
        pipeline's time with its commits stalled: its p99) and tries again at the next trim."""
        self._busy_timeout(RECLAIM_WAIT_MS / 1000)
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.OperationalError:
            pass  # busy: the next trim tries again
        finally:
            self._busy_timeout(BUSY_TIMEOUT_S)

    def limit_idle_transactions(self, idle_ms: int) -> None:
        """Nothing to bound: no server holds SQLite's write lock for a client that went silent (a
        process stopped inside a transaction holds it until it resumes or dies; one machine only)."""

    def close(self) -> None:
        self._db.close()


def _read_only(path: str) -> sqlite3.Connection:
    """``path`` opened read-only. A WAL database needs its shared-memory index (``-shm``) beside it:
    where this process may not create one (a read-only directory) it is read as an immutable
    snapshot, which is what a read-only copy of a store is."""
    def connect(flags: str) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{quote(path)}?{flags}", uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_S,
                               check_same_thread=False)

    db = connect("mode=ro")
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        db.close()
    return connect("mode=ro&immutable=1")
