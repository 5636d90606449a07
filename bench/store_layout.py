"""The bus's tables on SQLite with and without rowid, same rows, same run.

    .venv/bin/python bench/store_layout.py [--segments 1000] [--sizes 300,5000,50000,200000]

``segments`` and ``routes`` hold the bus's blobs. In a table ``WITHOUT ROWID`` every comparison
of a seek loads the row's whole payload (its overflow chain); with rowid a seek walks the primary
key's index and reads only the row it finds. For each segment size this inserts ``--segments``
segments of two producers, one transaction per batch (as a worker commits), reads each back by
the store's own query (``Bus.read_segments``), and deletes each producer's older half by
retention's statement (``Retention.trim``), with the store's ``segments`` table as
``store/schema.py`` makes it and the same table ``WITHOUT ROWID``. (``routes`` has the same
layout and the same kind of rows; it is not measured here.) Prints ms per operation and the ratio
(without rowid / with).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time

from headrace.store.schema import schema_statements

READ = ("SELECT batch, shard, data FROM segments WHERE stream = ? AND producer = ? AND batch > ? AND batch <= ? "
        "ORDER BY batch, shard")  # Bus.read_segments
DELETE = "DELETE FROM segments WHERE stream = ? AND producer = ? AND batch <= ?"  # Retention.trim, in one step


def segment_statements(without_rowid: bool) -> list[str]:
    made = [s for s in schema_statements("sqlite") if " segments(" in s or " ON segments(" in s]
    assert made and "WITHOUT ROWID" not in made[0], made
    return [made[0] + " WITHOUT ROWID", *made[1:]] if without_rowid else made


def measure(path: str, without_rowid: bool, size: int, segments: int) -> tuple[float, float, float]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    for statement in segment_statements(without_rowid):
        db.execute(statement)
    blob, producers = os.urandom(size), ("inject:s/0", "inject:s/1")
    began = time.perf_counter()
    for batch in range(1, segments + 1):
        db.execute("BEGIN")
        db.executemany("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)",
                       [("s", p, batch, 0, 10, blob, batch) for p in producers])
        db.execute("COMMIT")
    insert = time.perf_counter() - began
    began = time.perf_counter()
    for batch in range(1, segments + 1):
        for p in producers:
            rows = db.execute(READ, ("s", p, batch - 1, batch)).fetchall()
            assert len(rows) == 1 and len(rows[0][2]) == size
    read = time.perf_counter() - began
    began = time.perf_counter()
    deleted = sum(db.execute(DELETE, ("s", p, segments // 2)).rowcount for p in producers)
    delete = time.perf_counter() - began
    assert deleted == segments // 2 * len(producers)
    db.close()
    n = segments * len(producers)
    return insert / n * 1e3, read / n * 1e3, delete / deleted * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=1_000)
    parser.add_argument("--sizes", default="300,5000,50000,200000", help="segment sizes in bytes")
    args = parser.parse_args()
    print(f"{'bytes':>8} {'operation':>10} {'without rowid ms':>17} {'rowid ms':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as folder:
        for size in (int(s) for s in args.sizes.split(",")):
            got = {}
            for without in (True, False):
                got[without] = measure(os.path.join(folder, f"{size}-{without}.db"), without, size, args.segments)
            for i, operation in enumerate(("insert", "read", "delete")):
                old, new = got[True][i], got[False][i]
                print(f"{size:>8} {operation:>10} {old:>17.4f} {new:>9.4f} {old / new:>6.2f}")


if __name__ == "__main__":
    main()
