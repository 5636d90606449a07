"""store/sqlite.py: a write transaction takes SQLite's one write lock by retrying ``BEGIN IMMEDIATE``
itself, every fraction of a millisecond, instead of through SQLite's busy handler (whose sleeps grow
to 25 ms and more): it still waits for a writer that holds the lock, gets the lock once that writer
is done, gives up after the busy timeout as before, and sets the connection's busy timeout back
to ``BUSY_TIMEOUT_S`` for the statements outside transactions; a trim's steps, outside
transactions, yield to the pipeline's commits, and a trim kept from the lock for a whole busy
timeout gives up instead of failing the run."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from headrace.store import open_store
from headrace.store import sqlite as sqlite_store
from headrace.store.monitoring import WHOLE_COMPUTATION
from headrace.store.retention import Trimmed


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


@contextmanager
def another_writer(path: str) -> Iterator[threading.Thread]:
    """Another connection holding the write lock (an uncommitted row written) until the block ends."""
    release, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_write_lock, args=(path, release, held))
    holder.start()
    assert held.wait(10), "the other writer did not take the lock"
    try:
        yield holder
    finally:
        release.set()
        holder.join()


def test_a_writer_waits_for_the_lock_and_writes_once_the_holder_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(f"sqlite:///{path}")
    done = threading.Event()

    def write() -> None:
        with store._transaction():
            store._put_meta("waiter", str(store._get_meta("holder")))
        done.set()

    with another_writer(path):
        waiter = threading.Thread(target=write)
        waiter.start()
        assert not done.wait(0.3), "wrote while another connection held the write lock"
    waiter.join(10)
    assert done.is_set()
    assert store._get_meta("waiter") == "first"  # its transaction began after the holder's commit
    assert store._one("PRAGMA busy_timeout")[0] == sqlite_store.BUSY_TIMEOUT_S * 1000
    store.close()


def test_a_writer_gives_up_after_the_busy_timeout_and_keeps_its_busy_handler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(f"sqlite:///{path}")
    with another_writer(path):
        monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 0.2)
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            with store._transaction():
                store._put_meta("waiter", "never")
        assert not store._in_transaction()
        assert store._one("PRAGMA busy_timeout")[0] == 200
    with store._transaction():
        store._put_meta("waiter", "later")
    assert store._get_meta("waiter") == "later"
    store.close()


def test_a_read_transaction_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(f"sqlite:///{path}")
    with another_writer(path):
        with store._transaction(store.BEGIN_READ):
            assert store._get_meta("holder") is None  # the holder's row is not committed yet
    store.close()


def test_a_trim_kept_from_the_lock_for_a_whole_busy_timeout_gives_up_and_the_next_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "store.db")
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 0.2)
    store = open_store(f"sqlite:///{path}")
    reader, producer = "sink:out", "inject:events"
    with store._transaction():
        for batch in range(1, 11):
            store._x("INSERT INTO routes VALUES (?, 0, ?, ?, 'events', 0, 1, x'00')", (reader, producer, batch))
    store.record_positions(reader, WHOLE_COMPUTATION, {producer: 10})
    readers = {reader: {"events": [producer]}}
    with another_writer(path):
        assert store.trim(readers, {"events": None}, store.now()) == Trimmed(0, 0, 0, 0)
        assert not store._in_transaction()
    assert store._one("SELECT COUNT(*) FROM routes")[0] == 10
    assert store.trim(readers, {"events": None}, store.now()).routes == 10
    assert store._one("SELECT COUNT(*) FROM routes")[0] == 0
    store.close()
