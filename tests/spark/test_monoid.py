"""Monoid computations equal their plain versions on Spark: the same input, one run, both execution
modes, both stores (docs/architecture.md §3.13)."""

from __future__ import annotations

from typing import Any

from headrace import read, run
from headrace.store import open_store

from headrace.schema import StreamSchema
from headrace.store.segments import segment_columns

from .pipelines import EVENT_SCHEMA, monoid_beside_plain, monoid_oracle, skewed_events


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


def test_builtin_monoids_fold_a_typed_stream_from_its_columns_and_equal_the_plain_versions(
        spark: Any, store_url: str, mode: str) -> None:
    """``headrace.monoids``' hooks over a typed stream: the injector keeps the fields as columns,
    the monoids fold them (read tasks or workers) and give what the plain computations give."""
    events = skewed_events(3_000)
    url = store_url
    run(monoid_beside_plain(events, typed=True), store=url, spark=spark, progress=None, timeout_s=300, mode=mode)

    expected = monoid_oracle(events)
    assert dict((r.value["key"], r.value["count"]) for r in read("builtin_counts", url)) == expected["counts"]
    assert sorted((r.value["key"], r.value["count"]) for r in read("builtin_counts", url)) == sorted(
        (r.value["key"], r.value["count"]) for r in read("plain_counts", url))  # each key once
    sums = {s: sorted(((r.value["key"], r.value["end"]), r.value["sum"]) for r in read(s, url))
            for s in ("plain_sums", "monoid_sums", "builtin_sums")}
    assert dict(sums["builtin_sums"]) == expected["sums"]
    assert sums["builtin_sums"] == sums["plain_sums"] == sums["monoid_sums"]
    store = open_store(url)
    try:
        segments = store.segment_blobs("events", store.stream_producers("events")[0], 0, 10**9)
        assert segments and all(segment_columns(blob).fields_schema == StreamSchema(EVENT_SCHEMA).fingerprint for _, _, blob in segments)
        for name in ("BuiltinCount", "BuiltinWindowSum"):
            assert store.counters(name)["records"] == len(events)
    finally:
        store.close()
