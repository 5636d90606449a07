"""engine/statecache.py in a continuous worker (MillWheel §6.2's framework cache): hot keys'
state is served from memory while the worker holds the interval, and never once the interval
changed hands: after a takeover the fenced worker's user code sees the store's state, not its
cache, and so does the worker when it takes the interval back; a lost interval's cache is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by
from headrace.engine.batch import Production, ShardCommit, ShardSnapshot
from headrace.engine.statecache import StateCache
from headrace.engine.worker import Worker
from headrace.model import ComputationOptions
from headrace.names import CONTINUOUS, id_prefix
from headrace.plans import interval_plans, producers_of
from headrace.store import Store, open_store

from .test_worker import Clock

NAME, SHARDS, LEASE_MS = "Tally", 2, 1_000
WORDS = ["ant", "bee", "cat", "dog"]
INJECTOR = "inject:words"


class Tally(Computation):
    """Counts each word, and remembers every state it was handed."""

    def __init__(self) -> None:
        self.saw: list[tuple[str, int]] = []

    def process_record(self, ctx: Any, record: Any) -> None:
        self.saw.append((ctx.key, ctx.state or 0))
        ctx.state = (ctx.state or 0) + 1


def topology(**options: Any) -> Topology:
    t = Topology("cached")
    t.inject("words", injectors.records([{"word": "ant", "ts": 1}], timestamp="ts"))
    t.add(Tally, inputs={"words": key_by("word")}, shards=SHARDS, **options)
    return t


@pytest.fixture
def store(tmp_path: Path) -> Any:
    db = open_store(f"sqlite:///{tmp_path}/store.db")
    db.register(NAME, SHARDS)
    t = topology()
    for stream in t.streams():
        db.declare_stream(stream, *producers_of(t, stream, CONTINUOUS))
    yield db
    db.close()


def publish(store: Store, batch: int) -> None:
    prefix = id_prefix(INJECTOR, batch)
    store.publish(INJECTOR, batch, {"words": [Production("words", None, {"word": w, "ts": 10 * batch}, 10 * batch,
                                                          f"{prefix}{n}") for n, w in enumerate(WORDS)]}, 10 * batch,
                  str(batch))


def counts(store: Store) -> dict[str, int]:
    codec = ComputationOptions().codec
    return {w: codec.decode(raw) for w in WORDS if (raw := store.state(NAME, w)) is not None}


def workers(store: Store, clock: Clock, **options: Any) -> tuple[Worker, Worker]:
    plans = interval_plans(topology(**options))
    a = Worker(store, plans, "worker-a", 0, 2, lease_ms=LEASE_MS, clock=clock)
    b = Worker(store, plans, "worker-b", 1, 2, lease_ms=LEASE_MS, clock=clock)
    clock.now += LEASE_MS + 1  # both past their patience: each takes whatever is free
    return a, b


def cache_warm_then_taken(store: Store, clock: Clock, a: Worker, b: Worker) -> Tally:
    """a counts two batches (the second from its cache); then a stalls past its lease, b takes
    every interval and counts batch 3 on the store's state. a's code, with what it saw cleared."""
    a.maintain_leases()
    assert set(a.owned[NAME]) == set(range(SHARDS))
    code_a = a.code[NAME]
    assert isinstance(code_a, Tally)
    publish(store, 1)
    assert a.step()
    publish(store, 2)
    assert a.step()
    assert a.state_cache.hits == len(WORDS), "the second batch read every word's state from the cache"
    assert sorted(code_a.saw[-len(WORDS):]) == [(w, 1) for w in WORDS]
    clock.now += LEASE_MS + 1
    b.maintain_leases()
    assert set(b.owned[NAME]) == set(range(SHARDS))
    publish(store, 3)
    assert b.step()
    assert counts(store) == {w: 3 for w in WORDS}
    code_a.saw.clear()
    return code_a


def test_a_worker_that_takes_an_interval_back_reads_the_stores_state_not_its_old_cache(store: Store) -> None:
    clock = Clock()
    a, b = workers(store, clock)
    code_a = cache_warm_then_taken(store, clock, a, b)
    b.release_all()
    a.maintain_leases()  # a takes the intervals back, each at b's version
    assert set(a.owned[NAME]) == set(range(SHARDS))
    publish(store, 4)
    assert a.step()
    assert sorted(code_a.saw) == [(w, 3) for w in WORDS], "a worker was served the state it cached before a takeover"
    assert counts(store) == {w: 4 for w in WORDS}


def test_a_fenced_worker_that_runs_user_code_is_handed_the_stores_state(store: Store) -> None:
    """Without exactly-once's version check, the stalled worker does run batch 3 after b committed
    it: its user code sees b's counts (3), not the 2 it cached, and its commit is refused."""
    clock = Clock()
    a, b = workers(store, clock, semantics="at_least_once")
    code_a = cache_warm_then_taken(store, clock, a, b)
    a.step()
    assert sorted(code_a.saw) == [(w, 3) for w in WORDS], "a fenced worker was served its cached state"
    assert {e for _, _, e in a.fenced} == {"FencedWriterError"} and a.owned[NAME] == {}
    assert len(a.state_cache) == 0, "a fenced interval's cache is dropped"
    assert counts(store) == {w: 3 for w in WORDS}


def test_a_lease_lost_at_renewal_drops_the_intervals_cache(store: Store) -> None:
    clock = Clock()
    a, b = workers(store, clock)
    a.maintain_leases()
    publish(store, 1)
    assert a.step() and len(a.state_cache) == len(WORDS)
    clock.now += LEASE_MS + 1
    b.maintain_leases()
    a.maintain_leases()  # its renewal is refused: it drops the intervals, and their cached state
    assert a.owned[NAME] == {} and len(a.state_cache) == 0


class FakeShards:
    """load_shard of one interval, with the keys asked for recorded."""

    def __init__(self) -> None:
        self.states = {f"k{i}": bytes([i + 1]) for i in range(6)}
        self.version, self.sequencer = 4, 7
        self.asked: list[list[str]] = []

    def load_shard(self, computation: str, shard: int, keys: list[str], watermark: int, wall_clock: int,
                   tags: Any = ()) -> Any:
        self.asked.append(list(keys))
        return ShardSnapshot(self.version, {k: self.states[k] for k in keys if k in self.states}, [], 0,
                             self.sequencer)


def test_the_cache_is_bounded_and_reads_only_what_it_lacks() -> None:
    shards = FakeShards()
    cache = StateCache(capacity=3)
    snap = cache.load(shards, NAME, 0, 7, ["k0", "k1", "nope"], 0, 0)  # type: ignore[arg-type]
    assert snap.states == {"k0": b"\x01", "k1": b"\x02"} and len(cache) == 3
    cache.committed(ShardCommit(NAME, 0, 5, 4, 7, state_writes=[("k1", b"new"), ("k0", None)]))
    shards.version = 5
    snap = cache.load(shards, NAME, 0, 7, ["k0", "k1", "nope"], 0, 0)  # type: ignore[arg-type]
    assert shards.asked[-1] == [] and snap.states == {"k1": b"new"}  # k0 deleted, "nope" known absent
    cache.load(shards, NAME, 0, 7, ["k2", "k3"], 0, 0)  # type: ignore[arg-type]
    assert len(cache) == 3  # the least recently used went
    shards.version = 9  # someone else wrote the interval: nothing cached is used
    snap = cache.load(shards, NAME, 0, 7, ["k1", "k3"], 0, 0)  # type: ignore[arg-type]
    assert snap.states == {"k1": b"\x02", "k3": b"\x04"} and shards.asked[-1] == ["k1", "k3"]


class PrefetchingShards(FakeShards):
    """FakeShards whose rows can also be read for a whole pass at once."""

    def __init__(self) -> None:
        super().__init__()
        self.prefetched: list[list[tuple[str, int, int]]] = []

    def quiet_snapshots(self, wanted: list[tuple[str, int, int]], wall_clock: int) -> Any:
        self.prefetched.append(list(wanted))
        return {(c, s): ShardSnapshot(self.version, {}, [], 0, self.sequencer) for c, s, _ in wanted}


def test_a_pass_reads_its_rows_once_and_each_load_that_lacks_no_key_uses_its_row_once() -> None:
    shards = PrefetchingShards()
    cache = StateCache()
    cache.load(shards, NAME, 0, 7, ["k0"], 10, 5)  # type: ignore[arg-type]
    cache.prefetch(shards, [(NAME, 0, 10), (NAME, 1, 10)], 5)  # type: ignore[arg-type]
    assert shards.prefetched == [[(NAME, 0, 10), (NAME, 1, 10)]]
    snap = cache.load(shards, NAME, 0, 7, ["k0"], 10, 5)  # type: ignore[arg-type]
    assert snap.states == {"k0": b"\x01"} and shards.asked == [["k0"]]  # served by the pass's row
    cache.load(shards, NAME, 0, 7, ["k0"], 10, 5)  # type: ignore[arg-type]
    assert shards.asked[-1] == []  # a row serves one load: the next reads the store again
    cache.load(shards, NAME, 1, 7, ["k2"], 10, 5)  # type: ignore[arg-type]
    assert shards.asked[-1] == ["k2"]  # a key to read: the store's snapshot, not the row
    cache.prefetch(shards, [(NAME, 0, 10)], 5)  # type: ignore[arg-type]
    cache.load(shards, NAME, 0, 7, ["k0"], 11, 5)  # type: ignore[arg-type]
    assert shards.asked[-1] == []  # read at another watermark than the row's: the store again
    cache.prefetch(shards, [(NAME, 0, 10)], 5)  # type: ignore[arg-type]
    cache.drop(NAME, 0)  # fenced or lost: its row goes with its cache
    cache.load(shards, NAME, 0, 7, ["k0"], 10, 5)  # type: ignore[arg-type]
    assert shards.asked[-1] == ["k0"]


def test_a_batch_of_more_keys_than_the_cache_holds_leaves_no_older_value_of_any_of_them() -> None:
    shards = FakeShards()
    cache = StateCache(capacity=3)
    cache.load(shards, NAME, 0, 7, ["k1", "k0"], 0, 0)  # type: ignore[arg-type]  # k0 the more recent
    writes = [("k0", b"a"), ("k1", b"b"), ("k2", b"c"), ("k3", b"d")]
    cache.committed(ShardCommit(NAME, 0, 5, 4, 7, state_writes=writes))
    shards.states.update(writes)
    shards.version = 5
    assert len(cache) == 3
    snap = cache.load(shards, NAME, 0, 7, ["k0", "k1", "k2", "k3"], 0, 0)  # type: ignore[arg-type]
    # one key fell out and was read from the store; none came from the cache with its value from before
    assert len(shards.asked[-1]) == 1 and snap.states == dict(writes)
    cache.load(shards, NAME, 1, 7, ["k4"], 0, 0)  # type: ignore[arg-type]
    assert len(cache) == 3  # still bounded with another interval's key
