"""Positional record ids kept as ranges in the store (``seen_ranges``, engine/seen.py), on both
stores: a crashed commit leaves none of its ids, its retry on a new process sees each id once, a
later copy of an id inside a committed range is dropped after a restart, and ranges are
garbage-collected with the low watermark as exact ids are."""

from __future__ import annotations

from typing import Any

import pytest

from headrace import Computation
from headrace.engine import DedupCache, InputRecord, ShardBatch, run_shard_batch
from headrace.model import ComputationOptions
from headrace.store import open_store

NAME = "counted"


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


class Crash(BaseException):
    pass


def batch(number: int, ids: list[str], sequencer: int, stamp: int = 1_000, watermark: int = 0) -> ShardBatch:
    records = [InputRecord("in", "k", None, stamp, i) for i in ids]
    return ShardBatch(NAME, 0, number, records, watermark, watermark, 0, sequencer, frozenset({"in"}))


def run(url: str, shard_batch: ShardBatch, **options: Any) -> Any:
    store = open_store(url)
    try:
        return run_shard_batch(Count(), NAME, ComputationOptions.from_kwargs(NAME, {"shards": 1, **options}), None,
                               store, shard_batch, DedupCache())
    finally:
        store.close()


def state(url: str) -> Any:
    store = open_store(url)
    try:
        return ComputationOptions().codec.decode(store.state(NAME, "k")), store.counters(NAME), list(
            store.all_seen_ids(NAME, 0)), len(store._all("SELECT * FROM seen_ranges"))
    finally:
        store.close()


@pytest.mark.parametrize("step", ["seen_ids", "version", "before_commit"])
def test_a_crashed_commit_leaves_no_range_and_its_retry_counts_each_id_once(each_store: str, step: str) -> None:
    store = open_store(each_store)
    store.register(NAME, 1)
    sequencer = store.acquire_writer(NAME)

    def crash(at: str) -> None:
        if at == step:
            raise Crash(at)

    store.failpoint = crash
    first = batch(1, [f"inject:in:1:{n}" for n in (0, 2, 3, 7)], sequencer)
    with pytest.raises(Crash):
        run_shard_batch(Count(), NAME, ComputationOptions.from_kwargs(NAME, {"shards": 1}), None, store, first,
                        DedupCache())
    store.close()
    run(each_store, first)  # the retry, as a new process: nothing of the crashed attempt is seen
    run(each_store, batch(2, [f"inject:in:1:{n}" for n in (2, 5, 7, 8)] + ["inject:in:2:0"], sequencer))
    count, counters, seen, rows = state(each_store)
    assert count == 7 and counters["duplicates"] == 2  # 2 and 7 again: inside the first range, dropped
    assert sorted(seen) == sorted([f"inject:in:1:{n}" for n in (0, 2, 3, 5, 7, 8)] + ["inject:in:2:0"])
    assert rows == 3  # one range per prefix and commit, not one row per id


def test_ranges_are_forgotten_with_the_low_watermark_as_exact_ids_are(each_store: str) -> None:
    store = open_store(each_store)
    store.register(NAME, 1)
    sequencer = store.acquire_writer(NAME)
    store.close()
    run(each_store, batch(1, ["inject:in:1:0", "inject:in:1:1", "odd-id"], sequencer, stamp=1_000))
    run(each_store, batch(2, ["inject:in:2:0"], sequencer, stamp=5_000, watermark=1_500), dedup_slack_ms=100)
    _, _, seen, rows = state(each_store)
    assert sorted(seen) == ["inject:in:2:0"] and rows == 1  # the first batch's, older than 1,400, are gone
