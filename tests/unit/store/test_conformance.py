"""The backing store contract (docs/architecture.md §2 and §3.6), through ``open_store`` and the ``Store`` protocol only.

Every store implementation must pass this file: it runs once per ``store_url`` parameter (see
conftest.py). Nothing here may depend on SQLite, except the tests marked "SQLite only".
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from headrace.engine.batch import DueTimer, Production, ShardCommit
from headrace.engine.seen import SeenRange
from headrace.errors import FencedWriterError, OptionError, StaleBatchError, StoreError
from headrace.store import COMMIT_STEPS, BatchInfo, StoredRecord, open_store

C = "counter"
KEYS = ("a", "b", "c", "gone")
STREAMS = ("out", "side")


def pid(batch: int, seq: int, shard: int = 0) -> str:
    """A production id as the engine assigns it: ``<computation>:<shard>:<batch>:<seq>``."""
    return f"{C}:{shard}:{batch}:{seq}"


def make_commit(batch: int, base_version: int, sequencer: int, shard: int = 0, **fields: Any) -> ShardCommit:
    return ShardCommit(computation=C, shard=shard, batch=batch, base_version=base_version, sequencer=sequencer,
                       **fields)


def full_commit(sequencer: int, batch: int = 1, base_version: int = 0) -> ShardCommit:
    return make_commit(
        batch, base_version, sequencer,
        state_writes=[("a", b"state-a"), ("b", b"state-b")],
        timer_sets=[DueTimer("a", "t1", "watermark", 500), DueTimer("b", "w1", "wall", 70)],
        seen_ids=[("in-1", 10), ("in-2", 20)],
        productions=[Production("out", "a", {"n": 1}, 10, pid(batch, 1)),
                     Production("side", None, [1, 2], 20, pid(batch, 2))],
        input_watermark=40, output_watermark=30,
        counters={"records": 2, "duplicates": 1},
    )


def view(store: Any) -> dict[str, Any]:
    """Everything a reader can observe of computation ``C`` (to prove a write left no trace)."""
    return {
        "versions": store.shard_versions(C),
        "state": {k: store.state(C, k) for k in KEYS},
        "timers": {k: store.timers(C, k) for k in KEYS},
        "seen": {s: sorted(store.all_seen_ids(C, s)) for s in range(2)},
        "segments": {s: list(store.read_segments(s, C, 0, 100)) for s in STREAMS},
        "counters": store.counters(C),
        "due_timers": store.shards_with_due_timers(C, 10**15, 10**15),
        "journal": store.batches(C),
    }


@pytest.fixture
def writer(store: Any) -> int:
    store.register(C, 2)
    return store.acquire_writer(C)


# -- writers -----------------------------------------------------------------------------------------


def test_register_creates_shards_at_version_zero_and_is_idempotent(store: Any) -> None:
    store.register(C, 3)
    store.register(C, 3)
    assert store.shard_versions(C) == {0: 0, 1: 0, 2: 0}
    assert store.sequencer(C) == 0


def test_acquire_writer_increments_the_sequencer_for_every_store_object(store: Any, reopen: Any) -> None:
    store.register(C, 1)
    assert store.acquire_writer(C) == 1
    assert store.acquire_writer(C) == 2
    other = reopen()
    assert other.sequencer(C) == 2
    assert other.acquire_writer(C) == 3
    assert store.sequencer(C) == 3


def test_acquire_writer_of_an_unregistered_computation_is_refused(store: Any) -> None:
    expected = (f"Computation 'nope' is not registered in {store.url} (got 'nope'). "
                "Hint: call store.register(name, shards) first")
    with pytest.raises(StoreError, match=f"^{re.escape(expected)}$"):
        store.acquire_writer("nope")


# -- one shard commit --------------------------------------------------------------------------------


def test_commit_shard_writes_state_timers_seen_ids_segments_counters_and_version(store: Any, writer: int) -> None:
    store.commit_shard(full_commit(writer))
    assert store.shard_versions(C) == {0: 1, 1: 0}
    assert (store.state(C, "a"), store.state(C, "b"), store.state(C, "c")) == (b"state-a", b"state-b", None)
    assert store.timers(C, "a") == [DueTimer("a", "t1", "watermark", 500)]
    assert store.timers(C, "b") == [DueTimer("b", "w1", "wall", 70)]
    assert sorted(store.all_seen_ids(C, 0)) == ["in-1", "in-2"] and list(store.all_seen_ids(C, 1)) == []
    assert store.seen_ids(C, 0, ["in-2", "in-3"]) == {"in-2"}
    assert store.seen_ids(C, 1, ["in-2"]) == set()
    assert store.counters(C) == {"records": 2, "duplicates": 1}
    assert list(store.read_segments("out", C, 0, 1)) == [(1, StoredRecord("a", {"n": 1}, 10, pid(1, 1)))]
    assert list(store.read_segments("side", C, 0, 1)) == [(1, StoredRecord(None, [1, 2], 20, pid(1, 2)))]

    snap = store.load_shard(C, 0, ["a", "c"], watermark=0, wall_clock=100)
    assert (snap.version, snap.output_watermark) == (1, 30)
    assert snap.states == {"a": b"state-a", "b": b"state-b"}  # b: its due wall timer brings its state along
    assert snap.due_timers == [DueTimer("b", "w1", "wall", 70)]


def test_a_second_commit_replaces_deletes_and_adds_up(store: Any, writer: int) -> None:
    store.commit_shard(full_commit(writer))
    store.commit_shard(make_commit(
        2, 1, writer,
        state_writes=[("a", None), ("b", b"state-b2")],
        timer_sets=[DueTimer("b", "w1", "wall", 90)], timer_deletes=[("a", "t1")],
        seen_ids=[("in-3", 30)], forget_ids_before=15,
        input_watermark=50, output_watermark=20, counters={"records": 5},
    ))
    assert store.shard_versions(C)[0] == 2
    assert (store.state(C, "a"), store.state(C, "b")) == (None, b"state-b2")
    assert store.timers(C, "a") == [] and store.timers(C, "b") == [DueTimer("b", "w1", "wall", 90)]
    assert sorted(store.all_seen_ids(C, 0)) == ["in-2", "in-3"]  # in-1 (timestamp 10 < 15) forgotten
    assert store.counters(C) == {"records": 7, "duplicates": 1}
    assert store.load_shard(C, 0, [], 0, 0).output_watermark == 30  # never moves back


@pytest.mark.parametrize("step", COMMIT_STEPS[COMMIT_STEPS.index("begin"):COMMIT_STEPS.index("after_commit")])
def test_a_failure_at_any_step_before_commit_writes_nothing(store: Any, writer: int, step: str) -> None:
    class Boom(Exception):
        pass

    def failpoint(at: str) -> None:
        if at == step:
            raise Boom(at)

    store.commit_shard(full_commit(writer))
    before = view(store)
    store.failpoint = failpoint
    with pytest.raises(Boom):
        store.commit_shard(make_commit(
            2, 1, writer, state_writes=[("a", None), ("c", b"new")], timer_sets=[DueTimer("c", "x", "watermark", 1)],
            timer_deletes=[("a", "t1")], seen_ids=[("in-9", 90)], forget_ids_before=1000,
            productions=[Production("out", "c", 9, 90, pid(2, 1))], input_watermark=90, output_watermark=90,
            counters={"records": 1}))
    assert view(store) == before
    store.failpoint = None
    store.commit_shard(make_commit(2, 1, writer, state_writes=[("c", b"new")]))  # the store is still usable
    assert store.state(C, "c") == b"new"


@pytest.mark.parametrize("strong", [True, False], ids=["strong", "weak"])
def test_a_commit_on_a_stale_base_version_is_refused_and_writes_nothing(store: Any, writer: int,
                                                                        strong: bool) -> None:
    store.commit_shard(full_commit(writer))
    before = view(store)
    late = make_commit(2, 0, writer, state_writes=[("c", b"late")], seen_ids=[("in-9", 90)],
                       productions=[Production("out", "c", 9, 90, pid(2, 1))],
                       counters={"records": 1}, strong_productions=strong)
    expected = ("Shard 0 of 'counter' moved from version 0 to 1 while batch 2 ran (got 2). "
                "Hint: another attempt committed first; this attempt's outcome is discarded, re-read the shard")
    with pytest.raises(StaleBatchError, match=f"^{re.escape(expected)}$"):
        store.commit_shard(late)
    again = full_commit(writer)  # the very same batch, committed a second time by a slower attempt
    again.productions = [p._replace(value="other attempt") for p in again.productions]
    again.strong_productions = strong
    with pytest.raises(StaleBatchError):
        store.commit_shard(again)
    assert view(store) == before  # weak productions too: a stale attempt never replaces committed segments


def test_an_at_least_once_commit_never_goes_stale_nor_moves_the_version_back(store: Any, writer: int) -> None:
    store.commit_shard(make_commit(5, 0, writer, exactly_once=False, counters={"records": 1}))
    store.commit_shard(make_commit(3, 0, writer, exactly_once=False, counters={"records": 1}))
    assert store.shard_versions(C)[0] == 5
    assert store.counters(C) == {"records": 2}


@pytest.mark.parametrize("strong", [True, False], ids=["strong", "weak"])
def test_a_fenced_writer_commits_nothing(store: Any, reopen: Any, writer: int, strong: bool) -> None:
    newer = reopen()
    assert newer.acquire_writer(C) == writer + 1
    before = view(store)
    zombie = full_commit(writer)
    zombie.strong_productions = strong
    expected = (f"Writer of 'counter' with sequencer {writer} was fenced off: the store's sequencer is {writer + 1} "
                f"(got {writer}). Hint: a newer driver took over this computation; this process is a zombie and must stop")
    with pytest.raises(FencedWriterError, match=f"^{re.escape(expected)}$"):
        store.commit_shard(zombie)
    assert view(store) == before == view(newer)
    newer.commit_shard(full_commit(writer + 1))
    assert newer.shard_versions(C)[0] == 1


def test_commits_made_together_are_each_written_whole_or_refused_alone(store: Any, writer: int) -> None:
    store.commit_shard(make_commit(1, 0, writer, state_writes=[("a", b"first")], counters={"records": 1}))
    # shard 0's second attempt of batch 1 is stale: it fails at its version check, after its writes
    stale = make_commit(1, 0, writer, state_writes=[("a", b"stale"), ("gone", b"x")], counters={"records": 5},
                        timer_sets=[DueTimer("a", "t", "watermark", 7)],
                        productions=[Production("out", "a", {"n": 0}, 10, pid(1, 9))])
    fresh = make_commit(1, 0, writer, shard=1, state_writes=[("b", b"fresh")], counters={"records": 2},
                        productions=[Production("out", "b", {"n": 2}, 10, pid(1, 1, shard=1))], strong_productions=False,
                        journal_as=f"{C}/1", input_watermark=5, output_watermark=5)
    failures = store.commit_shards([stale, fresh])
    assert failures[1] is None
    expected = ("Shard 0 of 'counter' moved from version 0 to 1 while batch 1 ran (got 1). "
                "Hint: another attempt committed first; this attempt's outcome is discarded, re-read the shard")
    assert isinstance(failures[0], StaleBatchError) and str(failures[0]) == expected
    assert (store.state(C, "a"), store.state(C, "gone"), store.state(C, "b")) == (b"first", None, b"fresh")
    assert store.timers(C, "a") == [] and store.counters(C) == {"records": 3}
    assert store.shard_versions(C) == {0: 1, 1: 1}
    # an interval's weak productions are written in its commit, with its journal row
    assert [r.id for _, r in store.read_segments("out", f"{C}/1", 0, 10)] == [pid(1, 1, shard=1)]
    assert [(b.batch, b.output_watermark) for b in store.batches(f"{C}/1")] == [(1, 5)]

    # a newer owner took shard 1: the old owner's commit of it is refused, its commit of shard 0 is not
    claim = store.claim_intervals(C, [1], "newer", 0, 10**15)[1]
    failures = store.commit_shards([make_commit(2, 1, writer, state_writes=[("a", b"second")]),
                                    make_commit(2, 1, writer, shard=1, state_writes=[("b", b"zombie")])])
    assert failures[0] is None and isinstance(failures[1], FencedWriterError)
    assert str(failures[1]).startswith(f"Writer of 'counter' with sequencer {writer} was fenced off: the store's "
                                       f"sequencer is {claim.sequencer} (got {writer}). Hint: a newer driver")
    assert (store.state(C, "a"), store.state(C, "b")) == (b"second", b"fresh")


def test_commits_made_together_forget_each_ones_seen_ids_and_only_those(store: Any, writer: int) -> None:
    """A pass's commits forget their old seen ids (and id ranges) in one statement per table: each
    commit below its own threshold, in its own computation and interval, and nothing else."""
    other = "other"
    store.register(other, 2)
    mine = {C: writer, other: store.acquire_writer(other)}
    cells = [(c, s) for c in (C, other) for s in (0, 1)]
    store.commit_shards([
        ShardCommit(computation=c, shard=s, batch=1, base_version=0, sequencer=mine[c],
                    seen_ids=[(f"{c}{s}-{t}", t) for t in (10, 20, 30)],
                    seen_ranges=[SeenRange(f"{c}{s}:", 100 + t, 100 + t, t, b"\x01") for t in (10, 20, 30)])
        for c, s in cells])
    thresholds = {(C, 0): 15, (C, 1): 25, (other, 0): 35, (other, 1): None}
    store.commit_shards([ShardCommit(computation=c, shard=s, batch=2, base_version=1, sequencer=mine[c],
                                     forget_ids_before=thresholds[(c, s)]) for c, s in cells])
    kept = {(c, s): sorted(store.exact_seen_ids(c, s)) for c, s in cells}
    assert kept == {(C, 0): [f"{C}0-20", f"{C}0-30"], (C, 1): [f"{C}1-30"], (other, 0): [],
                    (other, 1): ["other1-10", "other1-20", "other1-30"]}
    newest = {(c, s): sorted(n for *_, n in store.seen_range_extents(c, s)) for c, s in cells}
    assert newest == {(C, 0): [20, 30], (C, 1): [30], (other, 0): [], (other, 1): [10, 20, 30]}


# -- the watermark journal -----------------------------------------------------------------------------


def test_the_journal_is_monotonic(store: Any, writer: int) -> None:
    assert store.latest_batch(C) is None
    assert store.complete_batch(C, 1, 10, 100, writer) == 100
    assert store.complete_batch(C, 2, 5, 50, writer) == 100  # a lower watermark never lowers the journal
    assert store.complete_batch(C, 3, 20, 200, writer) == 200
    assert [(b.batch, b.input_watermark, b.output_watermark) for b in store.batches(C)] == [
        (1, 10, 100), (2, 10, 100), (3, 20, 200)]
    assert [b.batch for b in store.batches(C, after=1)] == [2, 3]
    latest = store.latest_batch(C)
    assert isinstance(latest, BatchInfo) and (latest.producer, latest.batch, latest.output_watermark) == (C, 3, 200)
    assert store.batch_info(C, 2)[:4] == (C, 2, 10, 100) and store.batch_info(C, 9) is None


def test_latest_batches_gives_each_producers_last_batch_and_leaves_out_those_without_one(store: Any,
                                                                                        writer: int) -> None:
    assert store.latest_batches([]) == {}
    for batch in (1, 2, 3):
        store.complete_batch(C, batch, batch, batch, writer)
    store.complete_batch("other/1", 7, 0, 0)
    assert store.latest_batches([C, "other/1", "never"]) == {C: 3, "other/1": 7}


def test_completing_a_batch_again_is_idempotent(store: Any, writer: int) -> None:
    store.complete_batch(C, 1, 10, 100, writer)
    store.complete_batch(C, 2, 20, 200, writer)
    journal = store.batches(C)
    assert store.complete_batch(C, 2, 90, 900, writer) == 200  # a replayed batch: the journaled watermark
    assert store.complete_batch(C, 1, 0, 0, writer) == 100
    assert store.batches(C) == journal


def test_completing_a_batch_is_fenced_by_the_sequencer(store: Any, reopen: Any, writer: int) -> None:
    store.complete_batch(C, 1, 10, 100, writer)
    reopen().acquire_writer(C)
    expected = (f"Writer of 'counter' with sequencer {writer} was fenced off: the store's sequencer is {writer + 1} "
                f"(got {writer}). Hint: a newer driver took over this computation; this process is a zombie and must stop")
    for batch in (1, 2):
        with pytest.raises(FencedWriterError, match=f"^{re.escape(expected)}$"):
            store.complete_batch(C, batch, 20, 200, writer)
    assert [b.batch for b in store.batches(C)] == [1]
    assert store.complete_batch(C, 2, 20, 200, writer + 1) == 200


# -- reading productions back ------------------------------------------------------------------------------


def test_committed_productions_come_back_in_production_order(store: Any, writer: int) -> None:
    produced = [Production(STREAMS[i % 3 == 0], f"k{i}", {"i": i}, 1000 - i, pid(1, i)) for i in range(1, 13)]
    store.commit_shard(make_commit(1, 0, writer, productions=produced))
    assert store.committed_productions(C, 0, 1) == produced  # across streams, seq 10 after seq 9
    assert store.committed_productions(C, 0, 2) == []
    assert store.committed_productions(C, 1, 1) == []


def test_read_segments_returns_batches_after_upto_in_batch_and_shard_order(store: Any, writer: int) -> None:
    for batch in (1, 2, 3):
        for shard in (1, 0):
            store.commit_shard(make_commit(batch, batch - 1, writer, shard=shard, productions=[
                Production("out", f"k{shard}", (batch, shard, n), batch * 10 + n, pid(batch, n, shard))
                for n in (1, 2)] + [Production("side", None, "x", 0, pid(batch, 3, shard))]))
    got = list(store.read_segments("out", C, 1, 3))
    assert [(b, r.value) for b, r in got] == [
        (b, (b, s, n)) for b in (2, 3) for s in (0, 1) for n in (1, 2)]
    assert got[0] == (2, StoredRecord("k0", (2, 0, 1), 21, pid(2, 1, 0)))
    assert list(store.read_segments("out", C, 3, 9)) == []
    assert list(store.read_segments("nothing", C, 0, 9)) == []
    assert C in store.stream_producers("side")


def test_a_commit_deletes_many_rows_of_each_kind_and_only_those(store: Any, writer: int) -> None:
    """Deletes of several rows go as one statement on PostgreSQL (a VALUES list joined to the
    table): each deletes exactly its rows, and a partial only below the deleting batch."""
    store.commit_shard(make_commit(1, 0, writer, state_writes=[(k, k.encode()) for k in "abcd"],
                                   timer_sets=[DueTimer(k, "t", "watermark", 10) for k in "abc"],
                                   partial_writes=[("k", 10, b"k1"), ("j", 20, b"j1"), ("m", 30, b"m1")]))
    store.commit_shard(make_commit(2, 1, writer, state_writes=[("a", None), ("c", None), ("zz", None)],
                                   timer_deletes=[("a", "t"), ("b", "t"), ("b", "nope")],
                                   partial_deletes=[("k", 10), ("j", 20)], partial_writes=[("k", 10, b"k2")]))
    assert {k: store.state(C, k) for k in "abcd"} == {"a": None, "b": b"b", "c": None, "d": b"d"}
    assert {k: [t.tag for t in store.timers(C, k)] for k in "abc"} == {"a": [], "b": [], "c": ["t"]}
    assert store.load_partials(C, 0, None) == {("k", 10): [b"k2"], ("m", 30): [b"m1"]}


# -- timers ------------------------------------------------------------------------------------------------


def test_the_shards_with_due_timers_and_the_next_wall_timer(store: Any, writer: int) -> None:
    assert store.shards_with_due_timers(C, 10**15, 10**15) == []
    store.commit_shard(make_commit(1, 0, writer, timer_sets=[
        DueTimer("a", "late", "watermark", 500), DueTimer("b", "early", "watermark", 300),
        DueTimer("c", "wall", "wall", 100)]))
    store.commit_shard(make_commit(1, 0, writer, shard=1, timer_sets=[DueTimer("a", "x", "watermark", 400)]))
    assert store.shards_with_due_timers(C, 299, 99) == []
    assert store.shards_with_due_timers(C, 300, 99) == [0]
    assert store.shards_with_due_timers(C, 0, 100) == [0]
    assert store.shards_with_due_timers(C, 400, 0) == [0, 1]
    assert (store.next_wall_timer(C), store.next_wall_timer(C, [1]), store.next_wall_timer(C, [0])) == (100, None, 100)
    store.commit_shard(make_commit(2, 1, writer, timer_deletes=[("b", "early"), ("c", "wall")]))
    assert store.shards_with_due_timers(C, 399, 10**15) == []
    assert store.next_wall_timer(C) is None


def test_shards_with_due_timers(store: Any) -> None:
    store.register(C, 3)
    writer = store.acquire_writer(C)
    for shard, timer in ((0, DueTimer("a", "t", "watermark", 100)), (1, DueTimer("b", "t", "watermark", 1000)),
                         (2, DueTimer("c", "t", "wall", 50))):
        store.commit_shard(make_commit(1, 0, writer, shard=shard, timer_sets=[timer]))
    assert store.shards_with_due_timers(C, 99, 49) == []
    assert store.shards_with_due_timers(C, 100, 0) == [0]
    assert store.shards_with_due_timers(C, 100, 50) == [0, 2]
    assert store.shards_with_due_timers(C, 1000, 50) == [0, 1, 2]
    assert store.shards_with_due_timers(C, 10**6, 10**6) == [0, 1, 2]  # a watermark never fires a wall timer
    assert store.shards_with_due_timers(C, 0, 10**6) == [2]


def test_due_timer_shards_answers_each_computation_and_watermark_in_one_read(store: Any) -> None:
    store.register(C, 3)
    store.register("other", 2)
    writer, other = store.acquire_writer(C), store.acquire_writer("other")
    store.commit_shard(make_commit(1, 0, writer, shard=1, timer_sets=[DueTimer("a", "t", "watermark", 100)]))
    store.commit_shard(make_commit(1, 0, writer, shard=2, timer_sets=[DueTimer("b", "t", "wall", 50)]))
    store.commit_shard(ShardCommit("other", 0, 1, 0, other, timer_sets=[DueTimer("c", "t", "watermark", 10)]))
    assert store.due_timer_shards([], 0) == []
    assert store.due_timer_shards([(C, 99), ("other", 10), (C, 100)], 49) == [[], [0], [1]]
    assert store.due_timer_shards([(C, 100), ("other", 9)], 50) == [[1, 2], []]
    many = store.due_timer_shards([(C, 99)] * 300 + [(C, 100)], 49)  # more pairs than one statement takes
    assert many == [[]] * 300 + [[1]]
    assert store.commit_shards([]) == []


def test_quiet_snapshots_are_load_shard_without_keys_and_leave_out_intervals_with_a_due_timer(store: Any) -> None:
    store.register(C, 3)
    writer = store.acquire_writer(C)
    store.commit_shard(make_commit(1, 0, writer, shard=0, state_writes=[("a", b"x")], output_watermark=30))
    store.commit_shard(make_commit(1, 0, writer, shard=1, timer_sets=[DueTimer("b", "t", "watermark", 100)]))
    store.commit_shard(make_commit(1, 0, writer, shard=2, timer_sets=[DueTimer("c", "t", "wall", 50)]))
    assert store.quiet_snapshots([], 0) == {}
    quiet = store.quiet_snapshots([(C, 0, 1000), (C, 1, 99), (C, 2, 1000)], 49)
    assert quiet == {(C, s): store.load_shard(C, s, [], w, 49) for s, w in ((0, 1000), (1, 99), (2, 1000))}
    assert quiet[(C, 0)].states == {} and quiet[(C, 0)].output_watermark == 30
    assert quiet[(C, 0)].sequencer == writer and quiet[(C, 0)].version == 1
    assert store.quiet_snapshots([(C, 0, 1000), (C, 1, 100), (C, 2, 1000)], 50).keys() == {(C, 0)}

# -- opening stores ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, what, got, hint", [
    (42, "A store is named by a URL string", "42", "pass store='sqlite:///headrace.db'"),
    ("mysql://db/x", "Unknown store URL scheme", "'mysql://db/x'", "use sqlite:///path/file.db or postgresql://user@host:5432/database"),
    ("headrace.db", "Unknown store URL scheme", "'headrace.db'", "use sqlite:///path/file.db or postgresql://user@host:5432/database"),
    ("sqlite://", "A SQLite store URL needs a file path", "'sqlite://'",
     "write sqlite:///relative/file.db or sqlite:////absolute/file.db"),
    ("sqlite://host/x.db", "A SQLite store URL needs a file path", "'sqlite://host/x.db'",
     "write sqlite:///relative/file.db or sqlite:////absolute/file.db"),
    ("sqlite:///?synchronous=FULL", "A SQLite store URL needs a file path", "'sqlite:///?synchronous=FULL'",
     "write sqlite:///relative/file.db or sqlite:////absolute/file.db"),
    ("sqlite:///x.db?synchronous=sometimes", "Unknown SQLite store option", "'synchronous=sometimes'",
     "the one option is synchronous=OFF|NORMAL|FULL|EXTRA"),
    ("sqlite:///x.db?cache=shared", "Unknown SQLite store option", "'cache=shared'",
     "the one option is synchronous=OFF|NORMAL|FULL|EXTRA"),
    ("postgresql://u@h", "A PostgreSQL store URL needs a database name", "'postgresql://u@h'",
     "write postgresql://user@host:5432/database"),
])
def test_open_store_refuses_bad_urls(url: Any, what: str, got: str, hint: str) -> None:
    with pytest.raises(OptionError, match=f"^{re.escape(f'{what} (got {got}). Hint: {hint}')}$"):
        open_store(url)


def test_a_postgresql_server_that_is_not_there_is_named_with_the_fix() -> None:
    url = "postgresql://headrace:secret@127.0.0.1:1/nowhere"
    with pytest.raises(StoreError, match=r"^Cannot connect to the PostgreSQL store: connection failed: .*Connection refused.* "
                       r"\(got 'postgresql://headrace:\*\*\*@127\.0\.0\.1:1/nowhere'\)\. Hint: start the server and check host, port, user and database in the URL$") as caught:
        open_store(url)
    assert "secret" not in str(caught.value)


def test_a_store_reopened_on_its_url_sees_everything(store: Any, reopen: Any, writer: int) -> None:
    store.commit_shard(full_commit(writer))
    store.complete_batch(C, 1, 40, 30, writer)
    again = reopen()
    assert again.url == store.url
    assert view(again) == view(store)


def test_a_store_has_one_instance_id_for_its_lifetime(store: Any, reopen: Any) -> None:
    ident = store.instance_id()
    assert re.fullmatch(r"[0-9a-f]{32}", ident)
    assert reopen().instance_id() == ident == store.instance_id()


def test_store_errors_never_show_a_password(postgres_server: Any) -> None:
    url = postgres_server.new_database().replace("headrace@", "headrace:hunter2@")  # trust auth ignores it
    store = open_store(url)
    try:
        with pytest.raises(StoreError, match=r"^Computation 'nobody' is not registered in postgresql://headrace:\*\*\*@") as caught:
            store.acquire_writer("nobody")
        assert "hunter2" not in str(caught.value)
    finally:
        store.close()
