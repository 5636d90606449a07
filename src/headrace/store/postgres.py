"""The server store: PostgreSQL, for clusters whose workers cannot share one SQLite file.

Same tables and same logic as SQLite (``SQLStore``); what differs is concurrency. Writers run in
READ COMMITTED transactions of their own: a shard's commit reads its shard's row (and sequencer)
``FOR UPDATE`` (so a takeover waits for commits in flight, then fences every later one) and moves
its version with ``UPDATE … WHERE version = base`` (a concurrent attempt that lost finds no row).
Journal writes of one producer are serialized by a transaction-scoped advisory lock.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import StoreError
from .base import Failpoint
from .schema import NEWEST_TABLES, schema_statements
from .sql import SQLStore

__all__ = ["PostgresStore"]

SCHEMA_LOCK = 0x68656164  # advisory lock id: processes that open a fresh database at once create it once


class PostgresStore(SQLStore):
    """``postgresql://user[:password]@host[:port]/database[?libpq options]``."""

    BEGIN_WRITE = "BEGIN"
    BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    FOR_SHARE = " FOR SHARE"
    FOR_UPDATE = " FOR UPDATE"
    GREATEST = "GREATEST"

    def __init__(self, url: str, *, failpoint: Failpoint | None = None):
        import psycopg
        from psycopg import pq

        self.url, self.failpoint = url, failpoint
        self._idle = pq.TransactionStatus.IDLE
        self._sql: dict[str, str] = {}
        try:
            self._db = psycopg.connect(url, autocommit=True, connect_timeout=30)
        except psycopg.OperationalError as e:
            raise StoreError(f"Cannot connect to the PostgreSQL store: {' '.join(str(e).split())}", got=_redacted(url),
                             hint="start the server and check host, port, user and database in the URL") from None
        if any(self._one("SELECT to_regclass(?)", (table,))[0] is None for table in NEWEST_TABLES):
            # only when missing: CREATE INDEX IF NOT EXISTS would queue behind every open commit
            with self._transaction():
                self._x("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
                for statement in schema_statements("postgresql"):
                    self._x(statement)

    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._db.execute(self._translate(sql), params)

    def _xmany(self, sql: str, rows: list[tuple]) -> None:
        if rows:
            with self._db.cursor() as cur:
                cur.executemany(self._translate(sql), rows)

    def _translate(self, sql: str) -> str:
        """The shared queries use ``?``; psycopg wants ``%s`` (and ``%%`` for a literal ``%``)."""
        out = self._sql.get(sql)
        if out is None:
            out = self._sql[sql] = sql.replace("%", "%%").replace("?", "%s")
        return out

    def _in_transaction(self) -> bool:
        return self._db.info.transaction_status != self._idle

    def _in_list(self, column: str, values: list[Any]) -> tuple[str, Any]:
        if values and all(isinstance(v, int) for v in values):
            # psycopg sends small ints as integer[]; bigint = ANY(integer[]) cannot be hashed, so a filter
            # tests each row against the whole array (100,000 intervals: 12 s instead of 0.1 s)
            return f"{column} = ANY(?::bigint[])", list(values)
        return f"{column} = ANY(?)", list(values)

    def _values(self, column: str, values: list[str]) -> tuple[str, Any]:
        return f"unnest(?::text[]) AS v({column})", list(values)

    def _lock_producer(self, producer: str) -> None:
        self._x("SELECT pg_advisory_xact_lock(hashtext(?))", (producer,))

    def limit_idle_transactions(self, idle_ms: int) -> None:
        """Have the server end this connection, rolling its transaction back, once the client has
        sent nothing for ``idle_ms`` inside a transaction: a client cut off from the server in the
        middle of a commit then holds its row locks (its shards', the computation's counters) that
        long, not for as long as its network is down (``idle_in_transaction_session_timeout``)."""
        self._x("SELECT set_config('idle_in_transaction_session_timeout', ?, false)", (str(idle_ms),))

    @property
    def shown_url(self) -> str:
        return _redacted(self.url)

    def close(self) -> None:
        self._db.close()


def _redacted(url: str) -> str:
    """The URL without its password, for error messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
