"""The store's schema version, checked when a store is opened (docs/architecture.md §3.6).

A new store records ``SCHEMA_VERSION`` in its ``meta`` table as it creates its tables. Opening a
store another version made fails at once, with what made it and what to do, instead of failing
mid-run with "no such column". A table added to ``schema.py`` is created in place in a store of
the same version (a missing table is made at open); a changed or added column, or a changed
meaning, bumps ``SCHEMA_VERSION``. A store made before versions were recorded (it has tables but
no version row) is adopted when every table has every column this version reads.
"""

from __future__ import annotations

import sqlite3
from functools import cache

from ..errors import StoreError
from ..names import meta
from .connection import Connection
from .schema import schema_statements

__all__ = ["SCHEMA_VERSION", "check_schema", "expected_columns"]

SCHEMA_VERSION = 1


@cache
def expected_columns() -> dict[str, frozenset[str]]:
    """Every table of this version and its columns (read from the schema made in memory)."""
    db = sqlite3.connect(":memory:")
    try:
        for statement in schema_statements("sqlite"):
            db.execute(statement)
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: frozenset(r[1] for r in db.execute(f"PRAGMA table_info({t})")) for t in tables}
    finally:
        db.close()


class Versioned(Connection):
    """What a dialect tells ``check_schema``: the tables and columns its database holds, and how
    to create the schema (once, by one process, when several open a new store at once)."""

    def _table_columns(self) -> dict[str, set[str]]:
        raise NotImplementedError

    def _create_schema(self) -> None:
        """Run every CREATE … IF NOT EXISTS statement, in the current write transaction."""
        raise NotImplementedError

    def _lock_schema(self) -> None:
        """Inside a write transaction: one process at a time creates the schema."""


def check_schema(db: Versioned, read_only: bool) -> None:
    """Create a new store's schema and record its version, or check an existing store's version;
    raise a ``StoreError`` naming the store if this headrace cannot work on it."""
    found = _version(db, db._table_columns())
    if found == SCHEMA_VERSION and not _missing_tables(db._table_columns()):
        return
    if read_only:
        if found is None:
            raise StoreError(f"{db.shown_url} is not a headrace store (it has no headrace tables)",
                             got=db.shown_url, hint="check --store: a run creates its store, the tools only read one")
        _refuse(db, found)
        return  # a store made before versions were recorded, with every column: readable as it is
    with db._transaction():
        db._lock_schema()
        tables = db._table_columns()
        found = _version(db, tables)
        _refuse(db, found)
        db._create_schema()
        db._put_meta(meta.SCHEMA_VERSION, str(SCHEMA_VERSION))


def _version(db: Versioned, tables: dict[str, set[str]]) -> int | None:
    """The store's recorded version; 0 for one made before versions were recorded; None for no store."""
    if "meta" not in tables:
        return None if not set(tables) & set(expected_columns()) else 0
    value = db._get_meta(meta.SCHEMA_VERSION)
    try:
        return 0 if value is None else int(value)
    except ValueError:
        raise StoreError(f"The store at {db.shown_url} records a schema version that is not a number",
                         got=value, hint="the meta row 'schema_version' was changed by hand: restore it") from None


def _missing_tables(tables: dict[str, set[str]]) -> list[str]:
    return sorted(set(expected_columns()) - set(tables))


def _refuse(db: Versioned, found: int | None) -> None:
    """Raise unless a store of version ``found`` is one this headrace can work on."""
    if found is None or found == SCHEMA_VERSION:
        return
    if found > SCHEMA_VERSION:
        raise StoreError(f"The store at {db.shown_url} was made by a newer headrace (schema version {found}; "
                         f"this headrace reads version {SCHEMA_VERSION})", got=found,
                         hint="run the headrace release that made it (or a newer one), or point --store at another "
                              "store")
    tables = db._table_columns()
    lacking = {t: sorted(cols - tables[t]) for t, cols in expected_columns().items() if t in tables
               and cols - tables[t]}
    if found == 0 and not lacking:
        return  # made before versions were recorded, and it has every column: adopted
    shown = "; ".join(f"table {t} lacks {', '.join(c)}" for t, c in sorted(lacking.items()))
    raise StoreError(f"The store at {db.shown_url} was made by an older headrace (schema version {found}; this "
                     f"headrace reads version {SCHEMA_VERSION}{': ' + shown if shown else ''})", got=found,
                     hint="finish its work with the headrace release that made it and start this one on a new store "
                          "(its outputs stay readable with that release); there is no in-place migration yet")
