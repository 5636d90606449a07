"""engine/dedup.py: the Bloom filter never forgets an id and errs at its own rate; the index asks the
store's exact check only about the filter's "maybe" ids and stays valid for one shard version."""

from __future__ import annotations

import re
from typing import Callable, Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.engine.dedup import BloomFilter, DedupIndex
from headrace.engine.seen import SeenIds


@settings(deadline=None)  # numpy's first calls are slow on a loaded machine
@given(ids=st.lists(st.text(), max_size=300), capacity=st.integers(1, 200))
def test_a_bloom_filter_has_no_false_negatives(ids: list[str], capacity: int) -> None:
    bloom = BloomFilter(capacity=capacity)  # often over capacity: even saturated it must not forget
    bloom.add_many(ids)
    assert bloom.contains_many(ids).tolist() == [True] * len(ids)


def test_an_empty_query_answers_nothing() -> None:
    bloom = BloomFilter(capacity=10)
    bloom.add_many([])
    assert bloom.count == 0
    assert bloom.contains_many([]).tolist() == []


@pytest.mark.parametrize("error_rate", [0.01, 0.05])
def test_false_positives_at_capacity_stay_near_the_error_rate(error_rate: float) -> None:
    capacity, probes = 10_000, 20_000
    bloom = BloomFilter(capacity=capacity, error_rate=error_rate)
    bloom.add_many([f"present-{i}" for i in range(capacity)])
    false_positives = int(bloom.contains_many([f"absent-{i}" for i in range(probes)]).sum())
    rate = false_positives / probes
    assert error_rate / 2 <= rate <= error_rate * 2, f"{false_positives} of {probes} absent ids reported present"


@pytest.mark.parametrize("error_rate", [0.001, 0.01, 0.2])
def test_saturated_once_it_holds_more_than_its_capacity(error_rate: float) -> None:
    bloom = BloomFilter(capacity=1_000, error_rate=error_rate)
    bloom.add_many([f"id-{i}" for i in range(1_000)])
    assert not bloom.saturated
    bloom.add_many(["one-more"])
    assert bloom.saturated


class FakeShardIds:
    """The store's exact ids of one shard, with the calls the index makes counted."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self.ids = set(ids)
        self.lookups: list[list[str]] = []
        self.loads = 0

    def lookup(self, ids: list[str]) -> set[str]:
        self.lookups.append(list(ids))
        return self.ids.intersection(ids)

    def load_all(self) -> list[str]:
        self.loads += 1
        return sorted(self.ids)

    def index(self) -> DedupIndex:
        return DedupIndex(self.lookup, self.load_all)


def test_the_exact_lookup_is_asked_only_about_maybe_ids() -> None:
    store = FakeShardIds(f"old-{i}" for i in range(100))
    index = store.index()
    index.ensure(1, 1)

    new = [f"new-{i}" for i in range(1_000)]
    assert index.seen(new) == set()
    assert store.lookups == []  # a filter sized for 100,000 holding 100: no "maybe" among 1,000 new ids

    mixed = ["new-a", "old-3", "new-b", "old-42", "new-c"]
    assert index.seen(mixed) == {"old-3", "old-42"}
    assert store.lookups == [["old-3", "old-42"]]


def test_ensure_rebuilds_only_when_the_version_changes() -> None:
    store = FakeShardIds(["a"])
    index = store.index()
    index.ensure(3, 1)
    index.ensure(3, 1)
    assert store.loads == 1

    store.ids.add("b")  # another process committed version 4 with id "b"
    index.ensure(4, 1)
    assert store.loads == 2
    assert index.seen(["b"]) == {"b"}


def test_ensure_rebuilds_under_a_new_writer_at_the_same_version() -> None:
    """A re-partition of the keys moves ids into a shard at an unchanged version, and always brings
    a new writer: a filter built under the old one would call a moved id certainly new."""
    store = FakeShardIds(["a"])
    index = store.index()
    index.ensure(5, 1)
    store.ids.add("moved")
    index.ensure(5, 2)
    assert store.loads == 2
    assert index.seen(["moved"]) == {"moved"}


def test_committed_keeps_the_index_in_step_without_a_reload() -> None:
    store = FakeShardIds(["a"])
    index = store.index()
    index.ensure(1, 1)

    store.ids.update(["x", "y"])  # what this shard's own commit of version 2 wrote
    index.committed(2, SeenIds([("x", 1), ("y", 1)], []))
    index.ensure(2, 1)
    assert store.loads == 1
    assert index.version == 2
    assert index.seen(["x", "y", "z"]) == {"x", "y"}


def test_a_saturated_index_is_rebuilt_bigger_at_the_same_version() -> None:
    store = FakeShardIds()
    index = store.index()
    index.ensure(1, 1)
    many = [f"id-{i}" for i in range(100_001)]  # one more than the smallest filter holds
    store.ids.update(many)
    index.committed(2, SeenIds([(i, 1) for i in many], []))
    index.ensure(2, 1)
    assert store.loads == 2


@pytest.mark.parametrize("call, name", [
    (lambda index: index.seen(["a"]), "check(ids, timestamps)"),
    (lambda index: index.committed(1, SeenIds([("a", 1)], [])), "committed(version, seen)"),
])
def test_using_the_index_before_ensure_says_what_to_call_first(call: Callable[[DedupIndex], object],
                                                                name: str) -> None:
    index = FakeShardIds().index()
    with pytest.raises(RuntimeError, match="^" + re.escape(
            f"DedupIndex.{name} was called before ensure(version, writer): call ensure(version, writer) first") + "$"):
        call(index)
