"""Monoid computations equal their plain versions on Spark: the same input, one run, both execution
modes, both stores (docs/architecture.md §3.13)."""

from __future__ import annotations

from typing import Any

from headrace import read, run
from headrace.store import open_store

from .pipelines import monoid_beside_plain, monoid_oracle, skewed_events


def test_monoid_count_and_window_sum_equal_their_plain_versions(spark: Any, each_store: str, mode: str) -> None:
    events = skewed_events(3_000)
    run(monoid_beside_plain(events), store=each_store, spark=spark, progress=None, timeout_s=300, mode=mode)

    expected = monoid_oracle(events)
    counts = {s: [(r.value["key"], r.value["count"]) for r in read(s, each_store)]
              for s in ("plain_counts", "monoid_counts")}
    sums = {s: [((r.value["key"], r.value["end"]), r.value["sum"]) for r in read(s, each_store)]
            for s in ("plain_sums", "monoid_sums")}
    assert dict(counts["plain_counts"]) == expected["counts"]
    assert sorted(counts["monoid_counts"]) == sorted(counts["plain_counts"])  # each key emitted once, equal
    assert dict(sums["plain_sums"]) == expected["sums"]
    assert sorted(sums["monoid_sums"]) == sorted(sums["plain_sums"])  # each window emitted once, equal
    store = open_store(each_store)
    try:
        for name in ("MonoidCount", "MonoidWindowSum"):
            assert store.counters(name)["records"] == len(events)
            assert all(store.load_partials(name, shard, None) == {} for shard in range(2))  # all emitted and gone
    finally:
        store.close()
