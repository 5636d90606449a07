"""store/sqlite.py: a write transaction takes SQLite's one write lock by retrying ``BEGIN IMMEDIATE``
itself, every fraction of a millisecond, instead of through SQLite's busy handler (whose sleeps grow
to 25 ms and more): it still waits for a writer that holds the lock, gets the lock once that writer
is done, gives up after the busy timeout as before, and leaves the connection's busy timeout as it
found it for the statements outside transactions."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from headrace.store import open_store
from headrace.store import sqlite as sqlite_store


def hold_write_lock(path: str, release: threading.Event, held: threading.Event) -> None:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO meta VALUES ('holder', 'first')")
        held.set()
        release.wait(30)
        db.execute("COMMIT")
    finally:
        db.close()


def test_a_writer_waits_for_the_lock_and_writes_once_the_holder_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(f"sqlite:///{path}")
    release, held, done = threading.Event(), threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_write_lock, args=(path, release, held))
    holder.start()
    held.wait(10)

    def write() -> None:
        with store._transaction():
            store._put_meta("waiter", str(store._get_meta("holder")))
        done.set()

    waiter = threading.Thread(target=write)
    waiter.start()
    assert not done.wait(0.3), "wrote while another connection held the write lock"
    release.set()
    holder.join()
    waiter.join(10)
    assert done.is_set()
    assert store._get_meta("waiter") == "first"  # its transaction began after the holder's commit
    assert store._one("PRAGMA busy_timeout")[0] == sqlite_store.BUSY_TIMEOUT_S * 1000
    store.close()


def test_a_writer_gives_up_after_the_busy_timeout_and_keeps_its_busy_handler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(f"sqlite:///{path}")
    release, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_write_lock, args=(path, release, held))
    holder.start()
    held.wait(10)
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            with store._transaction():
                store._put_meta("waiter", "never")
        assert not store._in_transaction()
        assert store._one("PRAGMA busy_timeout")[0] == 200
    finally:
        release.set()
        holder.join()
    with store._transaction():
        store._put_meta("waiter", "later")
    assert store._get_meta("waiter") == "later"
    store.close()


def test_a_read_transaction_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(f"sqlite:///{path}")
    release, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_write_lock, args=(path, release, held))
    holder.start()
    held.wait(10)
    try:
        with store._transaction(store.BEGIN_READ):
            assert store._get_meta("holder") is None  # the holder's row is not committed yet
    finally:
        release.set()
        holder.join()
    store.close()
