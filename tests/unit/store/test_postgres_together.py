"""store/postgres.py: a commit's writes go out as data-modifying WITH clauses of two statements
(``_together``), not a round trip each, its ``BEGIN`` in one message with its first statement, and
what they write is what the statements one by one wrote: checked on a real server, with the
statements the connection sent counted."""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from typing import Any, Iterator

import pytest

from headrace.engine.batch import DueTimer, Production, QuietReport, ShardCommit
from headrace.engine.seen import SeenRange
from headrace.store import open_store

C = "counter"


@pytest.fixture
def store(postgres_server: Any) -> Iterator[Any]:
    s = open_store(postgres_server.new_database())
    s.register(C, 4)
    yield s
    s.close()


def counted(store: Any) -> list[str]:
    """The texts of the statements ``store`` sends from now on."""
    sent: list[str] = []
    execute = store._db.execute

    def counting(query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(query if isinstance(query, str) else str(query))
        return execute(query, *args, **kwargs)

    store._db.execute = counting
    return sent


def commit(sequencer: int, shard: int, **fields: Any) -> ShardCommit:
    return ShardCommit(computation=C, shard=shard, batch=1, base_version=0, sequencer=sequencer,
                       journal_as=f"{C}/{shard}", input_watermark=50, output_watermark=40, **fields)


def test_a_pass_of_intervals_commits_in_two_statements_besides_its_check_and_its_commit(store: Any) -> None:
    sequencer = store.acquire_writer(C)
    commits = [commit(sequencer, shard,
                      state_writes=[(f"k{shard}", f"v{shard}".encode()), (f"gone{shard}", None)],
                      timer_sets=[DueTimer(f"k{shard}", "t", "watermark", 900)],
                      seen_ids=[(f"id-{shard}-old", 5), (f"id-{shard}", 60)],
                      seen_ranges=[SeenRange(f"p{shard}:", 1, 1, 60, b"\x01")], forget_ids_before=10,
                      productions=[Production("out", f"k{shard}", shard, 60, f"{C}:{shard}:1:1")],
                      positions={"inject:events": 7}, counters={"records": 2})
               for shard in (0, 2)]
    sent = counted(store)
    failures = store.commit_shards(commits, [QuietReport(C, sequencer, {"inject:events": 7}, 50, 40)])
    assert failures == [None, None]
    # the session prepares the check on its first use, then runs it by name with the BEGIN
    assert [s.split()[0] for s in sent] == ["PREPARE", "BEGIN;", "WITH", "WITH", "COMMIT"], sent
    assert sent[0].startswith("PREPARE headrace_") and sent[0].endswith(" FOR UPDATE")
    assert sent[1].startswith("BEGIN; EXECUTE headrace_")  # the check rides with the BEGIN
    assert ") UPDATE shards SET " in sent[2]  # the carrier: the statement's row count is the update's own

    assert {k: store.state(C, k) for k in ("k0", "k2", "gone0")} == {"k0": b"v0", "k2": b"v2", "gone0": None}
    assert [t.tag for t in store.timers(C, "k2")] == ["t"]
    assert sorted(store.exact_seen_ids(C, 0)) == ["id-0"]  # id-0-old: older than its own forgetting
    assert [r[0] for r in store.seen_range_extents(C, 2)] == ["p2:"]
    assert [r.id for _, r in store.read_segments("out", f"{C}/2", 0, 1)] == [f"{C}:2:1:1"]
    assert store.shard_versions(C) == {0: 1, 1: 0, 2: 1, 3: 0}
    assert [b.batch for b in store.batches(f"{C}/0")] == [1]
    assert store.counters(C) == {"records": 4}


def test_writes_past_a_statements_parameter_limit_go_in_more_statements_and_all_arrive(store: Any) -> None:
    sequencer = store.acquire_writer(C)
    keys = 65_535 // 3 + 1_000  # state rows of three parameters each: more than the protocol lets one statement have
    sent = counted(store)
    store.commit_shard(commit(sequencer, 1, state_writes=[(f"k{i}", b"v") for i in range(keys)],
                              counters={"records": keys}))
    assert sum(s.startswith(("WITH", "INSERT")) for s in sent) >= 3  # the state rows alone take three statements
    assert store.state(C, "k0") == b"v" and store.state(C, f"k{keys - 1}") == b"v"
    assert store._one("SELECT COUNT(*) FROM state WHERE computation = ?", (C,))[0] == keys
    assert store.counters(C) == {"records": keys} and store.shard_versions(C)[1] == 1


def test_held_writes_past_a_byte_budget_go_in_more_statements_and_all_arrive(store: Any, monkeypatch: Any) -> None:
    import headrace.store.postgres as postgres

    monkeypatch.setattr(postgres, "MAX_HELD_BYTES", 2_000)  # the server refuses a message past 1 GB; here 2 kB
    sequencer = store.acquire_writer(C)
    sent = counted(store)
    store.commit_shard(commit(sequencer, 1, state_writes=[(f"k{i}", bytes([i]) * 500) for i in range(10)],
                              seen_ids=[(f"id{i}", 60) for i in range(10)], counters={"records": 10}))
    assert sum(s.startswith(("WITH", "INSERT", "DELETE", "UPDATE")) for s in sent) >= 3
    assert [store.state(C, f"k{i}") for i in range(10)] == [bytes([i]) * 500 for i in range(10)]
    assert len(store.exact_seen_ids(C, 1)) == 10 and store.shard_versions(C)[1] == 1


def test_a_transactions_first_statement_carries_its_begin_with_its_parameters_quoted_exactly(store: Any) -> None:
    name = "it's 100% \\ a ? $1 \u00e9"
    store.put_meta(name, "found")
    sent = counted(store)
    with store._transaction(store.BEGIN_READ):
        assert store._one("SELECT value FROM meta WHERE name = ?", (name,))[0] == "found"
        assert store._one("SELECT value FROM meta WHERE name = ?", (name + "x",)) is None
    assert [s.split()[0] for s in sent] == ["PREPARE", "BEGIN", "SELECT", "COMMIT"], sent
    assert sent[1].startswith(f"{store.BEGIN_READ}; EXECUTE headrace_")


def test_a_first_statement_is_prepared_once_and_found_again_after_a_rollback_that_left_it(store: Any) -> None:
    sql = "SELECT value FROM meta WHERE name = ?"
    store.put_meta("a", "1")
    sent = counted(store)
    with pytest.raises(RuntimeError, match="undo"):
        with store._transaction():
            assert store._one(sql, ("a",))[0] == "1"
            raise RuntimeError("undo")
    for _ in range(2):
        with store._transaction():
            assert store._one(sql, ("a",))[0] == "1"
    # psycopg had prepared none of its own, so its ROLLBACK deallocated nothing: the second PREPARE finds it
    assert not store._db._prepared._names
    assert [s.split()[0] for s in sent] == ["PREPARE", "BEGIN;", "ROLLBACK", "PREPARE"] + ["BEGIN;", "COMMIT"] * 2, sent
    prepared = store._db.execute("SELECT name, statement FROM pg_prepared_statements").fetchall()
    assert [(n, q) for n, q in prepared if q.endswith("FROM meta WHERE name = $1")] == \
        [(store._first[sql], f"PREPARE {store._first[sql]} AS SELECT value FROM meta WHERE name = $1")]


def test_a_first_statement_is_prepared_again_after_psycopg_deallocates_every_statement_on_a_rollback(store: Any) -> None:
    sql = "SELECT value FROM meta WHERE name = ?"
    store.put_meta("a", "1")
    for _ in range(6):  # psycopg prepares a statement of its own on its fifth run: then a ROLLBACK deallocates all
        store._one("SELECT count(*) FROM meta WHERE name = ?", ("a",))
    sent = counted(store)
    for fails in (False, True, False):
        with pytest.raises(RuntimeError, match="undo") if fails else nullcontext():
            with store._transaction():
                assert store._one(sql, ("a",))[0] == "1"
                if fails:
                    raise RuntimeError("undo")
        if fails:  # psycopg deallocated every prepared statement, ours too
            name = "headrace_" + hashlib.md5(sql.encode()).hexdigest()[:24]
            assert store._db.execute("SELECT name FROM pg_prepared_statements WHERE name = $1", (name,)).fetchall() == []
    assert [s.split()[0] for s in sent] == ["PREPARE", "BEGIN;", "COMMIT", "BEGIN;", "ROLLBACK", "SELECT",
                                            "PREPARE", "BEGIN;", "COMMIT"], sent
    assert all(s.startswith("BEGIN; EXECUTE headrace_") for s in sent if s.startswith("BEGIN;"))


def test_a_first_statement_deallocated_behind_the_stores_back_runs_as_text_in_a_new_transaction(store: Any) -> None:
    sql = "SELECT value FROM meta WHERE name = ?"
    store.put_meta("a", "1")
    with store._transaction():
        store._one(sql, ("a",))
    store._db.execute(f"DEALLOCATE {store._first[sql]}")
    sent = counted(store)
    with store._transaction():
        assert store._one(sql, ("a",))[0] == "1"
        store._x("UPDATE meta SET value = ? WHERE name = ?", ("2", "a"))
    assert [s.split()[0] for s in sent] == ["BEGIN;", "ROLLBACK", "BEGIN;", "UPDATE", "COMMIT"], sent
    assert sent[2] == "BEGIN; SELECT value FROM meta WHERE name = 'a'" and store.get_meta("a") == "2"


def test_a_first_statement_the_server_cannot_prepare_goes_as_text_with_its_begin(store: Any) -> None:
    sent = counted(store)
    for _ in range(2):
        with store._transaction():
            assert store._one("SELECT ? IS NULL", ("it's",))[0] is False  # $1 of no type: no PREPARE takes it
    assert sent[0].startswith("PREPARE headrace_") and sent[0].endswith(" AS SELECT $1 IS NULL"), sent
    assert sent[1:] == ["BEGIN; SELECT 'it''s' IS NULL", "COMMIT"] * 2, sent  # tried once, then as text
    assert store._first["SELECT ? IS NULL"] is None


def test_a_first_statement_that_cannot_carry_the_begin_goes_after_it_in_the_same_transaction(store: Any) -> None:
    sent = counted(store)
    with pytest.raises(RuntimeError, match="undo"):
        with store._transaction():
            store._x("INSERT INTO state VALUES (?, ?, ?)", (C, "k", b"bytes are sent as they are"))
            raise RuntimeError("undo")
    assert sent == ["BEGIN", "INSERT INTO state VALUES ($1, $2, $3)", "ROLLBACK"]
    assert store.state(C, "k") is None  # it was inside the transaction, rolled back
    store._xmany("INSERT INTO state VALUES (?, ?, ?)", [(C, "a", b"1"), (C, "b", b"2")])
    with pytest.raises(RuntimeError, match="undo"):
        with store._transaction():  # an UPDATE of many rows has no one-statement form: executemany, which carries no BEGIN
            store._xmany("UPDATE state SET value = ? WHERE computation = ? AND key = ?", [(b"3", C, "a"), (b"4", C, "b")])
            raise RuntimeError("undo")
    assert store.state(C, "a") == b"1" and store.state(C, "b") == b"2"  # inside the transaction, rolled back


def test_a_transaction_that_sent_nothing_sends_neither_begin_nor_its_end(store: Any) -> None:
    sent = counted(store)
    with store._transaction():
        pass
    with pytest.raises(RuntimeError, match="nothing"):
        with store._transaction():
            raise RuntimeError("nothing")
    assert sent == [] and not store._in_transaction()


def test_a_consumers_heads_are_one_statement(store: Any) -> None:
    """The quiet reports and the journal's last batches, from one snapshot (tests/unit/engine/test_quiet_heads.py)."""
    sequencer = store.acquire_writer(C)
    store.commit_shards([commit(sequencer, 0)], [QuietReport(C, sequencer, {"inject:events": 7}, 90, 80)])
    sent = counted(store)
    heads = store.producer_heads([f"{C}/0", f"{C}/1", "inject:events"])
    assert len(sent) == 1 and " UNION ALL " in sent[0], sent
    # interval 1, under the same sequencer, is quiet since it began: batch 0, at the report's watermark
    assert {p: (h.batch, h.output_watermark) for p, h in heads.items()} == {f"{C}/0": (1, 80), f"{C}/1": (0, 80)}


def test_an_injectors_batch_is_its_lock_its_last_batch_one_statement_of_writes_and_its_commit(
        postgres_server: Any) -> None:
    """The segments, the routed segments, the resume point and the journal entry of a batch go as
    one statement (they went as four); what it wrote is what they wrote, its NOTIFY included."""
    from headrace import Computation, Topology, key_by
    from headrace.engine.publish import publish_injected
    from headrace.plans import routing_plan

    class Count(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.state = (ctx.state or 0) + 1

    t = Topology("published")
    t.inject("words", [])
    t.add(Count, "ByWord", inputs={"words": key_by("w")}, shards=2)
    store = open_store(postgres_server.new_database())
    listener = open_store(store.url)
    try:
        injector = "inject:words"
        words = [({"w": w}, 100 + i, None) for i, w in enumerate(["ant", "bee", "cat", "dog", "eel"])]
        listener.wait_for_commits([injector], 0)  # listening from here
        sent = counted(store)
        publish_injected(store, injector, 1, "words", words, 100, "resume-1", None, routing_plan(t), 1)
        # the lock goes with the BEGIN and the read of the last batch, which is prepared on its first use
        assert [s.split()[0] for s in sent] == ["PREPARE", "BEGIN;", "WITH", "COMMIT"], sent
        assert sent[1].startswith("BEGIN; SELECT pg_advisory_xact_lock(hashtext('inject:words')); EXECUTE headrace_")
        assert sent[2].count(" AS (INSERT INTO ") == 3 and ") INSERT INTO batches " in sent[2]
        assert store.checkpoint(injector) == "resume-1"
        assert [(b.batch, b.output_watermark) for b in store.batches(injector)] == [(1, 100)]
        assert [r.value["w"] for _, r in store.read_segments("words", injector, 0, 1)] == [w["w"] for w, *_ in words]
        routed = [(s.dest, k) for s in store.read_routes("ByWord", [(injector, 0, 1)]) for k in s.seg.keys]
        assert sorted(k for _, k in routed) == sorted(w["w"] for w, *_ in words) and {d for d, _ in routed} == {0, 1}
        assert listener.wait_for_commits([injector], 5.0), "the journal entry's NOTIFY did not come"
        sent.clear()
        publish_injected(store, injector, 1, "words", words, 100, "resume-1", None, routing_plan(t), 1)
        assert [s.split()[0] for s in sent] == ["BEGIN;", "COMMIT"], "a batch journaled already writes nothing"
    finally:
        listener.close()
        store.close()


def test_a_second_writer_of_a_producer_reads_its_last_batch_only_once_it_holds_the_lock(
        postgres_server: Any) -> None:
    """The read that rides in one message with the lock sees what the lock's holder committed: a
    zombie injector publishing the same batch finds it journaled and writes nothing."""
    import threading
    import time

    url = postgres_server.new_database()
    first, second, watcher = open_store(url), open_store(url), open_store(url)
    injector = "inject:words"
    locked, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    real = first._insert_segments

    def held_inside(encoded: Any) -> None:  # the first writer holds the lock here until told to go on
        locked.set()
        assert go.wait(30)
        real(encoded)

    first._insert_segments = held_inside

    def publish(store: Any, word: str) -> None:
        try:
            store.publish(injector, 1, {"words": [Production("words", None, {"w": word}, 10, f"{injector}:1:0")]},
                          10, f"after-{word}")
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    a = threading.Thread(target=publish, args=(first, "ant"))
    b = threading.Thread(target=publish, args=(second, "bee"))
    try:
        a.start()
        assert locked.wait(30)
        b.start()
        deadline = time.monotonic() + 30
        while not watcher._one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
                               "database = (SELECT oid FROM pg_database WHERE datname = current_database())")[0]:
            assert time.monotonic() < deadline, "the second writer never waited for the producer's lock"
            time.sleep(0.01)  # polling the server for a state, not ordering: the lock wait is the server's
        go.set()
        for thread in (a, b):
            thread.join(30)
            assert not thread.is_alive(), "a writer hung"
        assert errors == []
        assert [info.batch for info in watcher.batches(injector)] == [1]
        assert [r.value["w"] for _, r in watcher.read_segments("words", injector, 0, 1)] == ["ant"]
        assert watcher.checkpoint(injector) == "after-ant"
    finally:
        go.set()
        for thread in (a, b):
            if thread.ident is not None:
                thread.join(30)
        for s in (first, second, watcher):
            s.close()


@pytest.mark.parametrize("producer", ["inject:o'dd", "inject:back\\slash", "inject:100%?$1"])
def test_a_producers_lock_sent_with_its_begin_is_the_lock_a_bound_parameter_takes(store: Any, producer: str) -> None:
    """The lock quoted into the message's text locks the same key as the statement with the name
    bound: a writer of the one and a writer of the other exclude each other."""
    other = open_store(store.url)
    try:
        with store._transaction():
            store._lock_producer(producer)
            assert store.latest_batch(producer) is None  # the lock went out with the BEGIN and this read
            held = other._one("SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                              "database = (SELECT oid FROM pg_database WHERE datname = current_database())")
            bound = other._one("SELECT hashtext(?)", (producer,))[0]
            assert held is not None and held[0] == bound % 2**32
    finally:
        other.close()
