"""SQLite's table layout (store/schema.py): the bus's blob tables keep their rowid, so a seek reads
only the row it finds; every other table is its primary key's b-tree; a store made with the bus's
tables without rowid (before) reads and writes alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from headrace.names import meta
from headrace.store.schema import schema_statements
from headrace.store.versions import SCHEMA_VERSION
from headrace.store.sqlite import SQLiteStore

from .test_monitoring import publish, segment_reads

BLOB_TABLES = {"segments", "routes"}


def test_the_bus_blob_tables_keep_their_rowid_and_the_others_do_not(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "store.db"))
    try:
        made = dict(store._db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
        assert {name for name, sql in made.items() if not sql.endswith("WITHOUT ROWID")} == BLOB_TABLES
        publish(store, "inject:s", 1, 3)
        reads = segment_reads(store, lambda: len(list(store.read_segments("s", "inject:s", 0, 1))) == 3)
        assert len(reads) == 1, reads
        assert "USING INDEX sqlite_autoindex_segments_1" in reads[0][1], reads  # the key's index, then the row
    finally:
        store.close()


def test_a_store_whose_bus_tables_were_made_without_rowid_reads_and_writes_alike(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    db = sqlite3.connect(path)
    for statement in schema_statements("sqlite"):
        if any(f"TABLE IF NOT EXISTS {table}(" in statement for table in BLOB_TABLES):
            statement += " WITHOUT ROWID"
        db.execute(statement)
    db.execute("INSERT INTO meta VALUES (?, ?)", (meta.SCHEMA_VERSION, str(SCHEMA_VERSION)))  # as a store made
    db.commit()
    db.close()
    store = SQLiteStore(str(path))
    try:
        for batch in (1, 2):
            publish(store, "inject:s", batch, 3)
        assert [r.value for _, r in store.read_segments("s", "inject:s", 0, 2)] == [0, 1, 2, 0, 1, 2]
        assert store.trim_segments(older_than_ms=2**62) == 2
        without = [name for name, sql in store._db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
                   if sql.endswith("WITHOUT ROWID")]
        assert BLOB_TABLES <= set(without)  # the store kept the layout it was made with
    finally:
        store.close()
