"""store/intervals.py on both stores: continuous mode's leases taken and renewed for many intervals
at once, and the watermark authority's one-query read (docs/architecture.md §4.2)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from headrace.engine.batch import QuietReport, ShardCommit
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME
from headrace.store import open_store

C = "counter"


@pytest.fixture
def registered(store: Any) -> Any:
    store.register(C, 4)
    return store


def test_claims_take_only_the_intervals_without_a_live_lease_under_one_new_sequencer(registered: Any) -> None:
    store = registered
    store.start_interval_at(C, 1, {"inject:in": 3})
    first = store.claim_intervals(C, [2, 0, 1], "a", 100, 1_000)
    assert sorted(first) == [0, 1, 2]
    assert {c.sequencer for c in first.values()} == {store.sequencer(C)}
    assert (first[1].version, first[1].input_watermark, first[1].positions) == (0, BEGINNING_OF_TIME, {"inject:in": 3})
    assert first[0].positions == {}

    second = store.claim_intervals(C, [1, 2, 3], "b", 500, 1_500)  # 1 and 2 are a's until 1,000
    assert list(second) == [3] and second[3].sequencer == first[0].sequencer + 1
    assert store.interval_owners(C) == {0: ("a", 1_000, first[0].sequencer), 1: ("a", 1_000, first[1].sequencer),
                                        2: ("a", 1_000, first[2].sequencer), 3: ("b", 1_500, second[3].sequencer)}

    # a's leases lapsed: b takes interval 1, and a's renewal keeps only what it still holds
    third = store.claim_intervals(C, [1], "b", 1_001, 2_000)
    assert list(third) == [1]
    assert store.renew_leases("a", 3_000) == {(C, 0): first[0].sequencer, (C, 2): first[2].sequencer}
    assert store.interval_owners(C)[0] == ("a", 3_000, first[0].sequencer)
    assert store.interval_owners(C)[1] == ("b", 2_000, third[1].sequencer)
    # an owner renews intervals taken in different claims (two sequencers) at once
    assert store.renew_leases("b", 4_000) == {(C, 3): second[3].sequencer, (C, 1): third[1].sequencer}

    # a's release frees only what it still holds (not 1, b's now); b's frees both its claims' intervals
    store.release_intervals(C, {s: c.sequencer for s, c in first.items()})
    owners = store.interval_owners(C)
    assert (owners[0][:2], owners[2][:2], owners[1][:2]) == ((None, 0), (None, 0), ("b", 4_000))
    store.release_intervals(C, {3: second[3].sequencer, 1: third[1].sequencer})
    assert {o[:2] for o in store.interval_owners(C).values()} == {(None, 0)}


def test_a_claim_of_intervals_all_held_writes_nothing(registered: Any) -> None:
    store = registered
    store.claim_intervals(C, [0, 1, 2, 3], "a", 100, 1_000)
    before = (store.sequencer(C), store.interval_owners(C))
    assert store.claim_intervals(C, [0, 3], "b", 999, 2_000) == {}
    assert store.claim_intervals(C, [], "b", 999, 2_000) == {}
    assert (store.sequencer(C), store.interval_owners(C)) == before


def test_a_claim_beyond_the_intervals_takes_those_that_exist_and_tells_the_count(registered: Any) -> None:
    # a worker planned for an older, larger layout: its claims carry the store's count, which it checks
    claims = registered.claim_intervals(C, [2, 7, 9], "a", 100, 1_000)
    assert list(claims) == [2] and claims[2].shards == 4
    assert registered.claim_intervals("unknown", [0], "a", 100, 1_000) == {}  # nothing registered, nothing taken


def test_free_and_lapsed_intervals_are_found_in_one_statement(registered: Any) -> None:
    store = registered
    store.register("other", 2)
    assert store.claimable([C, "other"], "a", 100) == {C: [0, 1, 2, 3], "other": [0, 1]}
    store.claim_intervals(C, [0, 1], "a", 100, 1_000)
    assert store.claimable([C], "b", 500) == {C: [2, 3]}
    assert store.claimable([C], "b", 1_001) == {C: [0, 1, 2, 3]}  # a's leases lapsed
    assert store.claimable([], "b", 1_001) == {}


def test_low_watermarks_are_the_minimum_of_each_intervals_latest_journal_row(store: Any) -> None:
    assert store.low_watermarks("C") == (END_OF_TIME, END_OF_TIME)  # no intervals: nothing held back
    store.register("C", 2)
    store.complete_batch("C/0", 1, 10, 5)
    store.complete_batch("C/0", 2, 40, 30)  # only the latest row counts
    # an interval that never committed holds the computation at the beginning of time
    assert store.low_watermarks("C") == (BEGINNING_OF_TIME, BEGINNING_OF_TIME)
    store.complete_batch("C/1", 1, 20, 50)
    assert store.low_watermarks("C") == (20, 30)


def test_a_quiet_report_moves_the_positions_and_watermarks_of_every_interval_under_its_sequencer(store: Any) -> None:
    store.register("C", 3, "continuous")
    claims = store.claim_intervals("C", [0, 1], "a", 100, 1_000)
    sequencer = claims[0].sequencer
    for shard in (0, 1, 2):
        store.complete_batch(f"C/{shard}", 1, 10, 10)
    store.report_quiet([QuietReport("C", sequencer, {"inject:in": 7}, 70, 70)])
    store.report_quiet([QuietReport("C", sequencer, {"inject:in": 9}, 60, 60)])  # watermarks never move back
    heads = store.producer_heads(["C/0", "C/1", "C/2", "inject:in"])
    assert {p: h.output_watermark for p, h in heads.items()} == {"C/0": 70, "C/1": 70, "C/2": 10}
    assert store.interval_positions("C") == {0: {"inject:in": 9}, 1: {"inject:in": 9}}
    assert store.low_watermarks("C") == (10, 10)  # interval 2 is not under that sequencer
    store.complete_batch("C/2", 2, 80, 80)
    assert store.low_watermarks("C") == (70, 70)
    # another owner takes interval 1 over: it starts where the report left it
    later = store.claim_intervals("C", [1], "b", 1_001, 2_000)
    assert (later[1].positions, later[1].input_watermark) == ({"inject:in": 9}, 70)


def test_a_stream_is_declared_with_all_its_producers_at_once(store: Any) -> None:
    store.declare_stream("out", *[f"C/{i}" for i in range(3)])
    store.declare_stream("out", "C/2", "inject:out")  # again: nothing doubles
    assert store.stream_producers("out") == ["C/0", "C/1", "C/2", "inject:out"]


@pytest.mark.parametrize("step", ["timers", "productions", "before_commit"])
def test_a_worker_silent_inside_a_commit_holds_its_locks_no_longer_than_its_limit(postgres_server: Any,
                                                                                  step: str) -> None:
    """PostgreSQL: a worker cut off from the server in the middle of a commit holds row locks (its
    shard's, the computation's counters) that every other writer of the computation waits for.
    With ``limit_idle_transactions`` the server ends its transaction once it has sent nothing for
    that long, and another worker takes its lapsed intervals while it is still silent; what it was
    committing is gone (tests/netbed cuts a real link there). Silent midway through its
    statements or with all of them sent: the server's timer runs only after a statement answered
    with a sync, which psycopg's pipeline mode does not give until its end."""
    url = postgres_server.new_database()
    silent, other = open_store(url), open_store(url)
    silent.register(C, 2)
    silent.limit_idle_transactions(300)
    claims = silent.claim_intervals(C, [0, 1], "silent", 0, 100)
    inside, woke = threading.Event(), threading.Event()

    def failpoint(name: str) -> None:
        if name == step:  # some or all of the commit's statements sent: then silence
            inside.set()
            time.sleep(5)
            woke.set()

    silent.failpoint = failpoint
    failures: list[BaseException] = []

    def commit() -> None:
        try:
            silent.commit_shards([ShardCommit(C, 0, 1, 0, claims[0].sequencer, counters={"records": 1},
                                              state_writes=[("a", b"state"), ("b", None), ("c", None)],
                                              seen_ids=[("in-1", 10)],
                                              positions={"inject:in": 1}, journal_as=f"{C}/0")])
        except BaseException as exc:  # noqa: BLE001 - what the silent worker gets when it wakes
            failures.append(exc)

    thread = threading.Thread(target=commit)
    thread.start()
    assert inside.wait(10)
    taken = other.claim_intervals(C, [0, 1], "other", 200, 1_000)  # waits for the silent one's shard lock
    assert sorted(taken) == [0, 1] and not woke.is_set(), "taken only once the silent commit woke"
    thread.join()
    # the server's word when the worker's next statement reads it, else the connection it closed
    ended = (psycopg.errors.IdleInTransactionSessionTimeout, psycopg.OperationalError)
    assert len(failures) == 1 and isinstance(failures[0], ended), failures
    assert (other.shard_versions(C), other.counters(C), other.latest_batches([f"{C}/0"]), other.state(C, "a")) == (
        {0: 0, 1: 0}, {}, {}, None)
    other.close()
