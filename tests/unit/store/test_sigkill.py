"""Real crashes, on SQLite and on PostgreSQL: SIGKILL a process that commits large shard batches, restart it.

The child (sigkill_child.py) counts records per key (2,000 records over 200 keys per batch, 4
shards) and produces one record per input. After every kill a SQLite file must pass SQLite's
own integrity check, and the store must be consistent: each shard holds exactly the batches up to
its version (state counts, produced records, seen ids and counters agree with the input of
those batches, and nothing of a batch the kill interrupted); in the end every batch is
committed exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrace.engine import shard_of
from headrace.model import ComputationOptions
from headrace.store import open_store

from ...ci import long_only
from . import sigkill_child as child

CHILD = Path(child.__file__)
PER_KEY = child.RECORDS // child.KEYS
INDEXES = {s: [i for i in range(child.RECORDS) if shard_of(child.key_of(i), child.SHARDS) == s]
           for s in range(child.SHARDS)}  # a record's shard depends on its index only, the same every batch


def start(url: str, batches: int, *stall: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, str(CHILD), url, str(batches), *stall],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()  # type: ignore[union-attr]
    if line[:1] != ["ready"]:
        proc.kill()
        pytest.fail(f"the child did not start: {line} {proc.communicate()[1]}")
    return proc, int(line[1])


def kill(proc: subprocess.Popen, url: str) -> None:
    assert proc.poll() is None, "the child finished before it was killed: give it more batches"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    settle(url)


def settle(url: str) -> None:
    """On PostgreSQL the server process of a killed child finishes a COMMIT it had already been
    sent: wait until the child's sessions are gone, so ``check_store``'s reads see one state (once,
    under load, the versions were read before such a commit landed and its segment after)."""
    if not url.startswith("postgresql"):
        return
    import psycopg

    deadline = time.monotonic() + 30
    with psycopg.connect(url, autocommit=True) as con:
        while con.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid()").fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "a killed child's session outlived it by 30 s"
            time.sleep(0.01)


def journal_head(url: str) -> int:
    """The last batch the child journaled (a consistent read while it runs, unlike ``check_store``)."""
    store = open_store(url)
    try:
        latest = store.latest_batch(child.NAME)
        return latest.batch if latest else 0
    finally:
        store.close()


def finish(proc: subprocess.Popen, url: str, stalled_s: float = 60) -> tuple[str, str]:
    """The child's output once it exits; it may take as long as it needs on a loaded machine, as
    long as it journals a batch every ``stalled_s`` seconds."""
    head, moved = journal_head(url), time.monotonic()
    while True:
        try:
            return proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            now = journal_head(url)
            if now > head:
                head, moved = now, time.monotonic()
            if time.monotonic() - moved >= stalled_s:
                proc.kill()
                raise AssertionError(f"the child journaled nothing past batch {head} in {stalled_s} s")


def check_store(url: str) -> tuple[dict[int, int], int]:
    """Integrity and exactly-once consistency of whatever the kills left; returns the shard
    versions and the number of journaled batches."""
    if url.startswith("sqlite:///"):
        con = sqlite3.connect(url[len("sqlite:///"):])  # the file itself
        try:
            assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            con.close()
    store = open_store(url)
    try:
        versions = store.shard_versions(child.NAME)
        journal = [b.batch for b in store.batches(child.NAME)]
        done = len(journal)
        assert journal == list(range(1, done + 1))
        assert all(done <= v <= done + 1 for v in versions.values()), (journal, versions)  # journaled once all shards are

        expected = {(b, child.record_id(b, i)) for s, v in versions.items() for b in range(1, v + 1) for i in INDEXES[s]}
        produced = [(b, r.value) for b, r in store.read_segments(child.STREAM, child.NAME, 0, 10**9)]
        # nothing lost, nothing doubled, nothing of an interrupted batch
        assert len(produced) == len(expected) and set(produced) == expected

        codec = ComputationOptions().codec
        counts = {}
        for k in range(child.KEYS):
            key = child.key_of(k)
            raw = store.state(child.NAME, key)
            counts[key] = 0 if raw is None else codec.decode(raw)
            assert counts[key] == versions[shard_of(key, child.SHARDS)] * PER_KEY, key
        assert sum(counts.values()) == len(produced) == store.counters(child.NAME).get("records", 0)

        for s, v in versions.items():
            seen = list(store.all_seen_ids(child.NAME, s))
            assert len(seen) == v * len(INDEXES[s])
            assert set(seen) == {child.record_id(b, i) for b in range(1, v + 1) for i in INDEXES[s]}
            assert store.committed_productions(child.NAME, s, v + 1) == []
        return versions, done
    finally:
        store.close()


def wait_for(marker: Path, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert proc.poll() is None, f"the child exited before its stall: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, "the child never reached its stall"
        time.sleep(0.01)


@pytest.mark.parametrize("kills, batches", [
    (5, 300),
    pytest.param(25, 1500, marks=pytest.mark.slow),
])
def test_sigkill_at_random_moments_never_breaks_exactly_once(tmp_path: Path, store_url: str, kills: int,
                                                            batches: int) -> None:
    if "postgresql" in store_url:
        long_only("PostgreSQL", covered_by="SQLite here and PostgreSQL in tests/netbed and test_semantics_under_kills")
    db = store_url
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    print("seed", seed)

    # 1. a deterministic kill inside the transaction of batch 3, shard 1, just before COMMIT
    marker = tmp_path / "stalled"
    proc, first = start(db, batches, "3:1", str(marker))
    assert first == 1
    wait_for(marker, proc)
    assert check_store(db) == ({0: 3, 1: 2, 2: 2, 3: 2}, 2)  # while it sleeps in the open transaction
    kill(proc, db)
    # shard 0 had committed batch 3; shard 1's commit of it, killed before COMMIT, left nothing
    assert check_store(db) == ({0: 3, 1: 2, 2: 2, 3: 2}, 2)

    # 2. kills at random moments, each run resuming from the store
    journaled = [2]
    for _ in range(kills):
        proc, first = start(db, batches)
        assert first == journaled[-1] + 1  # resumes after the last journaled batch
        # each run commits at least one batch before its kill (so the runs make progress however
        # loaded the machine is), then dies at a random moment among the commits that follow
        deadline = time.monotonic() + 60
        while journal_head(db) < first:
            assert proc.poll() is None, f"the child exited early: {proc.communicate()[1]}"
            assert time.monotonic() < deadline, "the child committed nothing in 60 s"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        kill(proc, db)
        journaled.append(check_store(db)[1])
    assert journaled[-1] > journaled[0], f"no run made progress: {journaled}"

    # 3. the last run completes: every batch exactly once
    proc, first = start(db, batches)
    out, err = finish(proc, db)
    assert (proc.returncode, out.split(), err) == (0, ["done"], "")
    assert check_store(db) == ({s: batches for s in range(child.SHARDS)}, batches)
