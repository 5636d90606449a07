"""The SQL plumbing every part of the store is written against: statements, transactions, the few
phrases SQLite and PostgreSQL spell differently, the commit-step failpoint and the clock.

Each part of the store (``shards.py``, ``bus.py``, ``intervals.py``, ``rescale.py``,
``monitoring.py``) is a class over ``Connection``; ``sql.SQLStore`` puts them together and each
dialect (``sqlite.py``, ``postgres.py``) fills in the hooks.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Sequence

from ..errors import StoreError

__all__ = ["Connection", "Failpoint", "wall_clock_ms"]

Failpoint = Callable[[str], None]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Connection:
    """One connection to the database, and what every query needs of it."""

    url: str
    failpoint: Failpoint | None = None
    clock: Callable[[], int] = staticmethod(wall_clock_ms)  # what ``completed_at`` and ``created_at`` stamp
    BEGIN_WRITE = "BEGIN"
    BEGIN_READ = "BEGIN"
    FOR_SHARE = ""
    FOR_UPDATE = ""
    GREATEST = "MAX"

    # -- dialect hooks ------------------------------------------------------------------------------
    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:  # a cursor
        raise NotImplementedError

    def _xmany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        raise NotImplementedError

    def _begin(self, begin: str) -> None:
        """Start a transaction with ``begin`` (``BEGIN_WRITE`` or ``BEGIN_READ``)."""
        self._x(begin)

    def _in_list(self, column: str, values: list[Any]) -> tuple[str, Any]:
        """A condition ``column IN values`` and its one parameter."""
        raise NotImplementedError

    def _values(self, column: str, values: list[str]) -> tuple[str, Any]:
        """A FROM item with one row per value, in a column named ``column``, and its one parameter."""
        raise NotImplementedError

    def _ranges(self, ranges: list[tuple[str, int, int]]) -> tuple[str, Any]:
        """A FROM item with one row ``(p, lo, hi)`` per range, and its one parameter."""
        return self._records("p text, lo bigint, hi bigint", ranges)

    def _records(self, columns: str, rows: Sequence[Sequence[Any]]) -> tuple[str, Any]:
        """A FROM item with one row per ``rows`` item, in ``columns`` (``"name type, …"``, the
        types PostgreSQL's: an array type takes a list), and its one parameter."""
        raise NotImplementedError

    def _in_row_list(self, column: str, values: str) -> str:
        """A condition: ``column`` is in the list held by the FROM item column ``values``."""
        raise NotImplementedError

    def _per_range(self, ranges: str, rows: str, condition: str) -> str:
        """A FROM item: ``ranges`` (a FROM item of one row per lookup: ``_ranges``' or ``_values``')
        joined to ``rows`` (a table and its alias) on ``condition``, which names its columns:
        looked up row by row through an index where the planner would otherwise scan every row
        of ``rows``."""
        return f"{ranges} JOIN {rows} ON {condition}"

    def _latest_batch(self, producer: str, alias: str, join: str = "JOIN") -> str:
        """A ``join`` (``JOIN`` or ``LEFT JOIN``) that gives ``alias`` the journal's row of the
        last batch of ``producer`` (an expression over the FROM items before it), looked up
        through the journal's index."""
        return (f"{join} batches {alias} ON {alias}.producer = {producer} AND {alias}.batch = "
                f"(SELECT MAX(batch) FROM batches WHERE producer = {producer})")

    def _lock_producer(self, producer: str) -> None:
        """Serialize journal writes of one producer (no-op where BEGIN_WRITE already locks the database)."""

    def close(self) -> None:
        raise NotImplementedError

    @property
    def shown_url(self) -> str:
        """The URL as messages show it (no password)."""
        return self.url

    # -- plumbing -------------------------------------------------------------------------------------
    def now(self) -> int:
        return self.clock()

    def _step(self, name: str) -> None:
        if self.failpoint is not None:
            self.failpoint(name)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._x(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._x(sql, params).fetchall()

    def _write(self, sql: str, params: Sequence[Any]) -> None:
        """A write whose result nobody reads (a ``_together`` block may hold it)."""
        self._x(sql, params)

    def _together(self) -> ContextManager[None]:
        """``with self._together():`` writes whose results nobody reads (``_write``'s, ``_xmany``'s), sent in as
        few statements as the dialect allows (PostgreSQL: ``PostgresStore._together``); here each
        goes as it comes."""
        return nullcontext()

    def _transaction(self, begin: str | None = None) -> "Transaction":
        """``with self._transaction():`` a write transaction; ``_transaction(self.BEGIN_READ)`` a snapshot."""
        return Transaction(self, begin or self.BEGIN_WRITE)

    def _next_sequencer(self, computation: str) -> int:
        """A new sequencer of ``computation`` (every writer locks its computation row first, then shards)."""
        row = self._one("UPDATE computations SET sequencer = sequencer + 1 WHERE name = ? RETURNING sequencer",
                        (computation,))
        if row is None:
            raise StoreError(f"Computation {computation!r} is not registered in {self.shown_url}", got=computation,
                             hint="call store.register(name, shards) first")
        return int(row[0])

    def _put_meta(self, name: str, value: str) -> None:
        self._x("INSERT INTO meta VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value", (name, value))

    def _get_meta(self, name: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE name = ?", (name,))
        return None if row is None else str(row[0])


class Transaction:
    """``with store._transaction():`` BEGIN …; COMMIT on success, ROLLBACK on any exception (a kill included)."""

    def __init__(self, store: Connection, begin: str):
        self.store, self.begin = store, begin

    def __enter__(self) -> None:
        try:
            self.store._begin(self.begin)
        except BaseException:  # begun, then interrupted (a signal's exception) before ``with`` took over
            if self.store._in_transaction():
                self.store._x("ROLLBACK")
            raise

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.store._x("COMMIT")
        elif self.store._in_transaction():
            self.store._x("ROLLBACK")
