"""engine/worker.py without Spark: two continuous-mode ``Worker`` loops on one real SQLite store,
driven by hand (``maintain_leases()``, ``step()``) with an injected clock. Each key interval has
one owner; a worker whose lease lapsed loses its intervals to the other, its next commit is fenced
and leaves no trace, and every record is processed exactly once across the handover
(docs/architecture.md §2.7 per interval, §4.2)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace import Computation, Topology, injectors, key_by
from headrace.engine.batch import Production
from headrace.names import id_prefix
from headrace.engine.batch import rows_by_shard
from headrace.engine.worker import Worker
from headrace.names import interval as interval_producer
from headrace.model import END_OF_TIME
from headrace.names import CONTINUOUS
from headrace.plans import interval_plans as plans_of, producers_of
from headrace.store import Store, open_store

SHARDS = 4
LEASE_MS = 1_000
WORDS = [f"w{i % 13}" for i in range(120)]
INJECTOR = "inject:words"


class CountWords(Computation):
    """Counts each word; produces one record per input record, so each delivery is visible."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counted", {"word": ctx.key, "n": ctx.state, "input": record.id})


class Clock:
    """The workers' wall clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def topology() -> Topology:
    t = Topology("handover")
    t.inject("words", injectors.records([{"word": w, "ts": 1_000 + i} for i, w in enumerate(WORDS)], timestamp="ts"))
    t.add(CountWords, inputs={"words": key_by("word")}, outputs=["counted"], shards=SHARDS)
    return t


@pytest.fixture
def store(tmp_path: Path) -> Any:
    db = open_store(f"sqlite:///{tmp_path}/store.db")
    t = topology()
    db.register("CountWords", SHARDS)
    for stream in t.streams():
        db.declare_stream(stream, *producers_of(t, stream, CONTINUOUS))
    yield db
    db.close()


def publish(store: Store, batch: int, first: int, upto: int, watermark: int) -> None:
    """Injector batch ``batch``: the words [first, upto), ids as the injector thread makes them."""
    prefix = id_prefix(INJECTOR, batch)
    records = [Production("words", None, {"word": WORDS[i], "ts": 1_000 + i}, 1_000 + i, f"{prefix}{n}")
               for n, i in enumerate(range(first, upto))]
    store.publish(INJECTOR, batch, {"words": records}, watermark, str(upto))


def workers(store: Store, clock: Clock) -> tuple[Worker, Worker]:
    plans = plans_of(topology())
    return (Worker(store, plans, "worker-a", 0, 2, lease_ms=LEASE_MS, clock=clock),
            Worker(store, plans, "worker-b", 1, 2, lease_ms=LEASE_MS, clock=clock))


def owned(worker: Worker) -> set[int]:
    return set(worker.owned["CountWords"])


def store_owners(store: Store) -> dict[int, str | None]:
    return {shard: owner for shard, (owner, _, _) in store.interval_owners("CountWords").items()}


def committed(store: Store) -> dict[str, Any]:
    """Everything a commit of the computation writes, to compare before and after."""
    producers = [interval_producer("CountWords", i) for i in range(SHARDS)]
    return {
        "versions": store.shard_versions("CountWords"),
        "journal": {p: [(b.batch, b.input_watermark, b.output_watermark) for b in store.batches(p)] for p in producers},
        "outputs": {p: sorted(r.value["input"] for _, r in store.read_segments("counted", p, 0, 1 << 30))
                    for p in producers},
        "state": {w: store.state("CountWords", w) for w in set(WORDS)},
        "counters": store.counters("CountWords"),
    }


def run_until_idle(worker: Worker) -> None:
    for _ in range(20):
        if not worker.step():
            return
    pytest.fail(f"{worker.owner} still had work after 20 steps")


def test_each_interval_has_one_owner_and_a_live_lease_is_not_taken(store: Store) -> None:
    clock = Clock()
    a, b = workers(store, clock)
    a.maintain_leases()
    b.maintain_leases()
    mine, theirs = owned(a), owned(b)
    assert mine and theirs, "each worker takes its preferred intervals first"
    assert mine.isdisjoint(theirs) and mine | theirs == set(range(SHARDS))
    assert store_owners(store) == {**{s: "worker-a" for s in mine}, **{s: "worker-b" for s in theirs}}

    # past the newcomers' patience, b would take any interval whose lease lapsed: a's are live
    clock.now += LEASE_MS * 3 // 4
    a.maintain_leases()
    clock.now += LEASE_MS * 3 // 4
    b.maintain_leases()
    assert (owned(a), owned(b)) == (mine, theirs)
    assert store_owners(store) == {**{s: "worker-a" for s in mine}, **{s: "worker-b" for s in theirs}}

    a.release_all()
    b.release_all()
    assert store_owners(store) == {s: None for s in range(SHARDS)}


def test_a_lapsed_worker_loses_its_intervals_its_commit_is_fenced_and_every_record_counts_once(
        store: Store) -> None:
    clock = Clock()
    a, b = workers(store, clock)
    a.maintain_leases()
    b.maintain_leases()
    lost = owned(a)
    assert lost and owned(b) and lost | owned(b) == set(range(SHARDS))

    half = len(WORDS) // 2
    # a low watermark is always a valid promise; this one keeps batch 1's records on time, so one
    # read twice would show as a duplicate instead of being dropped as late
    publish(store, 1, 0, half, watermark=1_000)
    assert a.step() and b.step()
    assert not a.fenced and not b.fenced
    first = committed(store)
    assert sum(len(ids) for ids in first["outputs"].values()) == half

    # a stalls past its lease with work pending; b, renewing on time, takes a's intervals
    publish(store, 2, half, len(WORDS), watermark=END_OF_TIME)
    sequencers = {s: q for s, (_, _, q) in store.interval_owners("CountWords").items()}
    clock.now += LEASE_MS + 1
    b.maintain_leases()
    assert store_owners(store) == {s: "worker-b" for s in range(SHARDS)}
    assert owned(b) == set(range(SHARDS))
    assert all(store.interval_owners("CountWords")[s][2] > sequencers[s] for s in lost), "a takeover renews the sequencer"

    # a still believes it owns them: its next commits are refused, one per interval, and dropped
    before = committed(store)
    a.step()
    assert sorted(a.fenced) == sorted(("CountWords", s, "FencedWriterError") for s in lost)
    assert owned(a) == set(), "a fenced interval is dropped at once"
    assert committed(store) == before, "nothing a fenced worker did after losing its lease is in the store"
    a.step()
    assert len(a.fenced) == len(lost), "a dropped interval is not tried again"
    a.maintain_leases()
    assert owned(a) == set() and store_owners(store) == {s: "worker-b" for s in range(SHARDS)}

    run_until_idle(b)
    assert not b.fenced
    after = committed(store)
    delivered = Counter(i for ids in after["outputs"].values() for i in ids)
    expected = {f"{id_prefix(INJECTOR, 1)}{n}" for n in range(half)} | {
        f"{id_prefix(INJECTOR, 2)}{n}" for n in range(len(WORDS) - half)}
    assert set(delivered) == expected and set(delivered.values()) == {1}, "every record processed exactly once"
    counts = dict(Counter(WORDS))
    finals: dict[str, int] = {}
    for p in after["outputs"]:
        for _, r in store.read_segments("counted", p, 0, 1 << 30):
            finals[r.value["word"]] = max(finals.get(r.value["word"], 0), r.value["n"])
    assert finals == counts
    assert "late_dropped" not in after["counters"]
    for shard, version in after["versions"].items():
        journal = [b for b, _, _ in after["journal"][interval_producer("CountWords", shard)]]
        assert journal == list(range(1, version + 1)), f"interval {shard} journaled {journal} at version {version}"
        assert after["journal"][interval_producer("CountWords", shard)][-1][2] == END_OF_TIME


def test_a_lapsed_lease_nobody_took_is_renewed_by_its_owner(store: Store) -> None:
    clock = Clock()
    a, b = workers(store, clock)
    a.maintain_leases()
    b.maintain_leases()
    mine, theirs = owned(a), owned(b)
    clock.now += LEASE_MS * 3 // 4
    b.maintain_leases()
    clock.now += LEASE_MS * 3 // 4  # a's lease lapsed, but b did not look in the meantime
    a.maintain_leases()
    assert owned(a) == mine and owned(b) == theirs
    leases = store.interval_owners("CountWords")
    assert all(leases[s][0] == "worker-a" and leases[s][1] == clock.now + LEASE_MS for s in mine)
    b.maintain_leases()
    assert owned(b) == theirs


def test_an_idle_worker_that_lost_its_lease_notices_at_its_next_renewal(store: Store) -> None:
    """Paused with no work in hand, a worker never tries to commit: its renewal is refused and it
    drops its intervals without a fenced commit."""
    clock = Clock()
    a, b = workers(store, clock)
    a.maintain_leases()
    b.maintain_leases()
    lost = owned(a)
    clock.now += LEASE_MS + 1
    b.maintain_leases()
    assert store_owners(store) == {s: "worker-b" for s in range(SHARDS)}
    leases = store.interval_owners("CountWords")

    a.maintain_leases()
    assert lost and owned(a) == set() and a.fenced == []
    assert store.interval_owners("CountWords") == leases, "a's refused renewal changed nothing"


@given(sids=st.lists(st.one_of(st.none(), st.integers(0, 11)), max_size=80),
       owned=st.sets(st.integers(0, 11), max_size=12))
def test_a_segments_rows_go_to_the_owned_shards_in_order_however_many_it_owns(sids: list[int | None],
                                                                             owned: set[int]) -> None:
    """A worker routes a segment's rows a pass per shard when it owns up to 8, in one pass beyond:
    either way each owned shard gets exactly its rows, in order (None: a rejected record)."""
    got = {s: rows for s, rows in rows_by_shard(sids, owned).items() if rows}
    assert got == {s: [i for i, x in enumerate(sids) if x == s] for s in owned if s in sids}


def test_groups_that_share_a_sequencer_make_one_quiet_report_of_what_all_of_them_reached() -> None:
    # a claim took intervals that stood at different positions: two groups, one sequencer, and
    # the store keeps one report row per (computation, sequencer)
    from types import SimpleNamespace

    from headrace.engine.batch import QuietReport

    worker = SimpleNamespace(_reported={})
    plan = SimpleNamespace(name="C")
    ahead, behind = SimpleNamespace(sequencers={7}), SimpleNamespace(sequencers={7})
    moved = [(plan, ahead, {"p": 5, "q": 3}, 100), (plan, behind, {"p": 4, "q": 9, "r": 1}, 80)]
    assert Worker._reports(worker, moved) == [QuietReport("C", 7, {"p": 4, "q": 3, "r": 1}, 80, 80)]  # type: ignore[arg-type]
    assert Worker._reports(worker, moved) == []  # type: ignore[arg-type]  # nothing moved since: no report
