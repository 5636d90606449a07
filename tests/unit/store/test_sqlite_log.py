"""store/sqlite.py: the trim truncates SQLite's write-ahead log, which workers that always hold a
read snapshot would otherwise let grow for the whole run; a reader that holds its snapshot through
the trim delays the truncation to a later trim, and neither blocks for long nor loses a row."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from headrace.store import open_store
from headrace.store.sqlite import RECLAIM_WAIT_MS


def grow_log(path: str) -> None:
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("CREATE TABLE IF NOT EXISTS filler(n INTEGER, blob BLOB)")
        for n in range(200):
            db.execute("INSERT INTO filler VALUES (?, ?)", (n, os.urandom(8192)))


def test_the_trim_truncates_the_log_and_a_reader_only_delays_it(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(f"sqlite:///{path}")
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM meta").fetchone()  # holds a snapshot from before the writes
        grow_log(path)
        assert os.path.getsize(path + "-wal") > 1_000_000
        started = time.monotonic()
        store.trim({}, {}, store.now())
        waited_ms = (time.monotonic() - started) * 1000
        assert os.path.getsize(path + "-wal") > 1_000_000, "truncated under a reader's snapshot"
        assert waited_ms < RECLAIM_WAIT_MS + 2_000
        reader.execute("COMMIT")
        store.trim({}, {}, store.now())
        assert os.path.getsize(path + "-wal") == 0
        assert reader.execute("SELECT COUNT(*) FROM filler").fetchone()[0] == 200
    finally:
        reader.close()
        store.close()
