"""Rescaling (docs/architecture.md §3.6): ``register`` with another shard count re-partitions the
computation's keys in one transaction. Every test runs on SQLite and on PostgreSQL.

A keyed tally runs through the engine's one batch path at 4 shards, then 7, then 2, with one
``DedupCache`` kept across the layouts (as a reused Spark Python worker keeps it): each key's
state, timers, monoid partials and dedup ids must follow the key, and every writer of an old
layout must be fenced.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from headrace import Computation
from headrace.engine import DedupCache, InputRecord, shard_of
from headrace.engine.batch import ShardCommit
from headrace.engine.runner import run_batch
from headrace.errors import FencedWriterError, StoreError
from headrace.model import ComputationOptions
from headrace.store import open_store

C = "tally"
STREAM = "in"
KEYS = [f"key-{i}" for i in range(40)]
CLOSE_AT = 5_000

CHILD = """
import sys
from headrace.store import open_store
store = open_store(sys.argv[1])
store.register(sys.argv[2], int(sys.argv[3]))
print("rescaled", flush=True)
"""


class Tally(Computation):
    """Adds up each key's values; a watermark timer reports the total once."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + record.value
        ctx.set_timer("close", CLOSE_AT)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("totals", {"key": ctx.key, "total": ctx.state})


class Layout:
    """One writer of ``C`` at one shard count: batches through ``run_batch``."""

    def __init__(self, store: Any, shards: int, cache: DedupCache):
        self.store, self.shards, self.cache = store, shards, cache
        store.register(C, shards)
        self.sequencer = store.acquire_writer(C)
        self.options = ComputationOptions.from_kwargs(C, {"shards": shards})
        last = store.latest_batch(C)
        self.batch = last.batch if last else 0
        self.output = last.output_watermark if last else 0

    def run(self, records: list[InputRecord], watermark: int) -> Any:
        self.batch += 1
        outcome = run_batch(Tally(), C, self.options, None, self.store, self.store, batch=self.batch,
                            records=records, watermark_before=self.output, watermark_after=watermark,
                            wall_clock=0, sequencer=self.sequencer, previous_output=self.output,
                            dedup_streams=frozenset({STREAM}), dedup_cache=self.cache)
        self.output = outcome.output_watermark
        return outcome


def record_id(tag: str, i: int) -> str:
    """Half the ids positional (kept as ranges, ``engine/seen.py``), half arbitrary (kept exactly)."""
    return f"inject:{STREAM}:{tag}:{i}" if i % 2 else f"{tag}-{KEYS[i]}"


def records(tag: str, value: int = 1) -> list[InputRecord]:
    return [InputRecord(STREAM, k, value, 1_000, record_id(tag, i)) for i, k in enumerate(KEYS)]


def rows(store: Any, sql: str, *params: Any) -> list[tuple]:
    return [tuple(r) for r in store._all(sql, params)]


def check_layout(store: Any, shards: int, totals: dict[str, int]) -> None:
    """Every key's state once, with its total; its timer and partials in the shard its key hashes to."""
    assert store.computations()[C] == shards
    assert sorted(store.shard_versions(C)) == list(range(shards))
    assert rows(store, "SELECT key, COUNT(*) FROM state WHERE computation = ? GROUP BY key ORDER BY key", C) == \
        [(k, 1) for k in sorted(KEYS)]
    for key in KEYS:
        snapshot = store.load_shard(C, shard_of(key, shards), [key], 0, 0)
        assert pickle.loads(snapshot.states[key]) == totals[key]
    assert rows(store, "SELECT key, shard FROM timers WHERE computation = ? ORDER BY key", C) == \
        [(k, shard_of(k, shards)) for k in sorted(KEYS)]
    assert rows(store, "SELECT key, shard FROM partials WHERE computation = ? ORDER BY key", C) == \
        [(k, shard_of(k, shards)) for k in sorted(KEYS)]
    assert store.shards_with_due_timers(C, CLOSE_AT, 0) == sorted({shard_of(k, shards) for k in KEYS})


def add_partials(store: Any, layout: Layout) -> None:
    """A delta row per key (as a monoid computation writes them), in its key's shard."""
    for shard in range(layout.shards):
        store.commit_shard(ShardCommit(C, shard, layout.batch, layout.batch, layout.sequencer,
                                       partial_writes=[(k, 9_000, b"p") for k in KEYS
                                                       if shard_of(k, layout.shards) == shard],
                                       exactly_once=False))


def test_4_to_7_to_2_moves_state_timers_partials_and_ids_with_their_keys(store_url: str) -> None:
    store = open_store(store_url)
    cache = DedupCache()
    four = Layout(store, 4, cache)
    four.run(records("a"), 500)
    add_partials(store, four)
    totals = {k: 1 for k in KEYS}
    check_layout(store, 4, totals)

    seven = Layout(store, 7, cache)
    check_layout(store, 7, totals)
    assert store.shard_versions(C) == {s: 1 for s in range(7)}  # the journal's batch: the next is batch 2
    # every id seen under 4 shards is a duplicate in the shard its key now hashes to
    for i, key in enumerate(KEYS):
        assert record_id("a", i) in set(store.all_seen_ids(C, shard_of(key, 7)))
    outcome = seven.run(records("a") + records("b", 2), 600)  # "a" delivered again: dropped
    assert outcome.counters["duplicates"] == len(KEYS) and outcome.counters["records"] == len(KEYS)
    totals = {k: 3 for k in KEYS}
    check_layout(store, 7, totals)

    two = Layout(store, 2, cache)
    check_layout(store, 2, totals)
    outcome = two.run(records("b") + records("a") + records("c", 4), 700)
    assert outcome.counters["duplicates"] == 2 * len(KEYS)
    totals = {k: 7 for k in KEYS}
    check_layout(store, 2, totals)

    fired = two.run([], CLOSE_AT)  # every pending timer fires once, in its key's new shard
    assert sorted((p.value["key"], p.value["total"]) for p in fired.productions) == sorted(totals.items())
    assert rows(store, "SELECT COUNT(*) FROM timers WHERE computation = ?", C) == [(0,)]
    assert [e.detail for e in store.events(kinds=["rescaled"])] == ['{"from": 4, "to": 7}', '{"from": 7, "to": 2}']
    store.close()


def test_watermarks_start_at_the_slowest_old_shard_and_sequencers_are_renewed(store_url: str) -> None:
    store = open_store(store_url)
    four = Layout(store, 4, DedupCache())
    four.run(records("a"), 500)
    store._x("UPDATE shards SET input_watermark = 100 + shard, output_watermark = 200 + shard WHERE computation = ?",
             (C,))
    old = four.sequencer
    store.register(C, 7)
    assert {(r.input_watermark, r.output_watermark) for r in store.shard_rows(C)} == {(100, 200)}
    assert {r.sequencer for r in store.shard_rows(C)} == {old + 1} == {store.sequencer(C)}
    store.close()


def test_a_writer_of_the_old_layout_is_fenced(store_url: str) -> None:
    store = open_store(store_url)
    seven = Layout(store, 7, DedupCache())
    seven.run(records("a"), 500)
    old = seven.sequencer
    store.register(C, 2)
    new = store.sequencer(C)
    for shard in (1, 5):  # a shard that still exists, and one that went
        current = new if shard < 2 else 0
        expected = (f"Writer of 'tally' with sequencer {old} was fenced off: the store's sequencer is {current} "
                    f"(got {old}). Hint: a newer driver took over this computation; this process is a zombie "
                    "and must stop")
        with pytest.raises(FencedWriterError, match=f"^{re.escape(expected)}$"):
            store.commit_shard(ShardCommit(C, shard, 2, 1, old, state_writes=[("key-1", b"zombie")]))
    expected = (f"Writer of 'tally' with sequencer {old} was fenced off: the store's sequencer is {new} (got {old}). "
                "Hint: a newer driver took over this computation; this process is a zombie and must stop")
    with pytest.raises(FencedWriterError, match=f"^{re.escape(expected)}$"):
        store.complete_batch(C, 2, 600, 600, old)
    assert store.latest_batch(C).batch == 1
    store.close()


def test_a_shard_count_below_one_is_refused(store_url: str) -> None:
    store = open_store(store_url)
    Layout(store, 4, DedupCache())
    for bad in (0, -3, 2.5):
        expected = (f"Computation 'tally' needs a whole number of shards from 1 to 1048575 (got {bad}). "
                    "Hint: pass shards=N with N >= 1, e.g. shards=4")
        with pytest.raises(StoreError, match=f"^{re.escape(expected)}$"):
            store.register(C, bad)  # type: ignore[arg-type]
    assert store.computations()[C] == 4
    store.close()


def test_a_half_committed_batch_is_refused_until_it_completes(store_url: str) -> None:
    store = open_store(store_url)
    four = Layout(store, 4, DedupCache())
    four.run(records("a"), 500)
    # batch 2 committed in one shard, then the driver died before journaling it
    store.commit_shard(ShardCommit(C, 3, 2, 1, four.sequencer, state_writes=[("key-1", b"x")]))
    expected = (f"Rescaling 'tally' from 4 to 7 shards in {store.shown_url} is refused: shard 3 committed batch 2, "
                "which the journal has not completed (it is at batch 1) (got 7). Hint: run once more with "
                "shards=4 so that batch 2 completes, then change shards")
    with pytest.raises(StoreError, match=f"^{re.escape(expected)}$"):
        store.register(C, 7)
    assert store.computations()[C] == 4 and len(store.shard_versions(C)) == 4
    store.complete_batch(C, 2, 500, 500, four.sequencer)
    store.register(C, 7)
    assert store.shard_versions(C) == {s: 2 for s in range(7)}
    store.close()


def interval_commit(store: Any, shard: int, claim: Any, position: int, watermark: int, key: str) -> None:
    """An interval's commit in continuous mode: it read the injector up to ``position``."""
    store.commit_shard(ShardCommit(C, shard, claim.version + 1, claim.version, claim.sequencer,
                                   state_writes=[(key, pickle.dumps(1))], input_watermark=watermark,
                                   output_watermark=watermark, positions={"inject:in": position},
                                   journal_as=f"{C}/{shard}"))


def claim_all(store: Any, shards: int) -> dict[int, Any]:
    return store.claim_intervals(C, list(range(shards)), "worker", 0, 1 << 40)  # type: ignore[no-any-return]


def test_continuous_intervals_restart_at_the_slowest_position_behind_a_fence(store_url: str) -> None:
    store = open_store(store_url)
    store.register(C, 4, "continuous")
    for s, claim in claim_all(store, 4).items():  # the intervals read the injector to different batches
        interval_commit(store, s, claim, 10 + s, 100 + s, f"key-{s}")
    old = claim_all(store, 4)

    store.register(C, 7)
    claims = claim_all(store, 7)
    assert {s: (c.version, c.input_watermark, c.positions, c.shards) for s, c in claims.items()} == \
        {s: (2, 100, {"inject:in": 10}, 7) for s in range(7)}  # past every C/<i> batch; the slowest position
    fence = (4, {i: {"inject:in": 10 + i} for i in range(4)})
    assert all(c.fences == (fence,) for c in claims.values())
    # each new interval journals where it starts: its consumers' watermark is never above it
    assert {s: (b.batch, b.input_watermark, b.output_watermark) for s in range(7)
            for b in [store.latest_batch(f"{C}/{s}")]} == {s: (2, 100, 100) for s in range(7)}
    expected = (f"Writer of 'tally' with sequencer {old[1].sequencer} was fenced off: the store's sequencer is "
                f"{claims[1].sequencer} (got {old[1].sequencer}). Hint: a newer owner took interval 1 of this "
                "computation; this worker drops it and goes on")
    with pytest.raises(FencedWriterError, match=f"^{re.escape(expected)}$"):
        interval_commit(store, 1, old[1], 20, 200, "key-1")

    for s, claim in claims.items():  # the 7 intervals all read up to batch 12
        interval_commit(store, s, claim, 12, 110, f"key-{s}")
    store.register(C, 2)
    claims = claim_all(store, 2)
    assert {s: (c.version, c.positions) for s, c in claims.items()} == {s: (4, {"inject:in": 12}) for s in range(2)}
    # the 4-interval fence still covers batch 13 of old interval 3; the 7 stood together: no fence of theirs
    assert claims[0].fences == (fence,)
    assert store.all_positions(C) == {s: {"inject:in": 12} for s in range(2)}
    store.close()


def dump(store: Any) -> dict[str, list[tuple]]:
    """Every row the change touches."""
    return {table: rows(store, f"SELECT * FROM {table} WHERE {column} = ? ORDER BY 1, 2, 3", C)
            for table, column in (("computations", "name"), ("shards", "computation"), ("timers", "computation"),
                                  ("partials", "computation"), ("seen_ids", "computation"), ("seen_ranges", "computation"),
                                  ("state", "computation"))}


def test_a_sigkill_inside_the_change_leaves_the_old_layout(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    four = Layout(store, 4, DedupCache())
    four.run(records("a"), 500)
    add_partials(store, four)
    before = dump(store)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "HEADRACE_FAILPOINTS": f"rescale=sleep:60000:{marks}"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, store_url, C, "7"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not any(marks.iterdir()):  # the child is inside the transaction, timers and partials moved
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    child.communicate()

    after = open_store(store_url)
    assert dump(after) == before
    check_layout(after, 4, {k: 1 for k in KEYS})
    after.register(C, 7)  # the change, run again, is whole
    check_layout(after, 7, {k: 1 for k in KEYS})
    after.close()
    store.close()
