"""engine/seen.py and the range half of engine/dedup.py: positional ids kept as ranges stay an
exact set (no id reported seen that was not, none missed), at a range's edges, between adjacent
ranges, in a range's holes and for ids that only look positional."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.engine.dedup import DedupIndex
from headrace.engine.seen import SeenIds, SeenRange, make_ranges, merge_ranges, range_holds, range_ids, split_ids


def ranges_of(prefix: str, numbers: list[int], stamp: int = 5) -> list[SeenRange]:
    ordered = np.asarray(sorted(set(numbers)), np.int64)
    return make_ranges(prefix, ordered, np.full(len(ordered), stamp, np.int64))


tails = st.one_of(st.integers(0, 10**20).map(str), st.text(alphabet="0123456789:+-_ x٣", max_size=6))


@settings(deadline=None)
@given(ids=st.lists(st.tuples(st.sampled_from(["a:", "inject:s:7:", "", "b:c:", "x"]), tails).map("".join),
                    max_size=60))
def test_split_takes_every_id_apart_one_to_one(ids: list[str]) -> None:
    split = split_ids(ids)
    rebuilt = {int(i): ids[i] for i in split.exact}
    for prefix, (positions, numbers) in split.groups.items():
        for at, n in zip(positions.tolist(), numbers.tolist()):
            assert f"{prefix}{n}" == ids[at]  # the number spells the id back exactly
            rebuilt[at] = f"{prefix}{n}"
    assert [rebuilt[i] for i in range(len(ids))] == ids  # each position once, in one place or the other


def test_ids_that_only_look_positional_are_kept_exactly() -> None:
    ids = ["a:01", "a:1", "a:+1", "a: 1", "a:1_0", "a:٣", "a:", "a:1234567890123456789", "a", "a:10"]
    split = split_ids(ids)
    assert split.groups["a:"][0].tolist() == [1, 9] and split.groups["a:"][1].tolist() == [1, 10]
    assert split.exact == [0, 2, 3, 4, 5, 6, 7, 8]


@settings(deadline=None)
@given(numbers=st.sets(st.integers(0, 600), min_size=1, max_size=80))
def test_a_range_holds_exactly_its_numbers(numbers: set[int]) -> None:
    ranges = ranges_of("p:", list(numbers))
    probe = np.arange(-5, 700, dtype=np.int64)
    held = np.zeros(len(probe), bool)
    for r in ranges:
        held |= range_holds(r, probe)
        assert r.high - r.low < 64 * len(range_ids(r)) + 1  # a bitmap never far sparser than its numbers
    assert set(probe[held].tolist()) == numbers
    assert sorted(int(i.split(":")[1]) for r in ranges for i in range_ids(r)) == sorted(numbers)


def test_numbers_far_apart_make_ranges_of_their_own() -> None:
    ranges = ranges_of("p:", [0, 1, 2, 10_000, 10**15])
    assert [(r.low, r.high) for r in ranges] == [(0, 2), (10_000, 10_000), (10**15, 10**15)]


def test_merged_ranges_hold_the_union_as_new_as_the_newest() -> None:
    merged = merge_ranges([*ranges_of("p:", [0, 2, 4], stamp=1), *ranges_of("p:", [1, 2, 3], stamp=9),
                           *ranges_of("q:", [7], stamp=3)])
    assert [(r.prefix, range_ids(r), r.newest) for r in merged] == [
        ("p:", ["p:0", "p:1", "p:2", "p:3", "p:4"], 9), ("q:", ["q:7"], 3)]


class FakeRanges:
    """One shard's committed ranges and exact ids, with the range reads the index makes counted."""

    def __init__(self) -> None:
        self.ranges: list[SeenRange] = []
        self.reads = 0

    def lookup_ranges(self, prefix: str, low: int, high: int) -> list[SeenRange]:
        self.reads += 1
        return [r for r in self.ranges if r.prefix == prefix and r.low <= high and r.high >= low]

    def index(self) -> DedupIndex:
        index = DedupIndex(lambda ids: set(), lambda: [], self.lookup_ranges,
                           lambda: [(r.prefix, r.low, r.high, r.newest) for r in self.ranges])
        index.ensure(1, 1)
        return index

    def commit(self, index: DedupIndex, version: int, seen: SeenIds, forget_before: int | None = None) -> None:
        self.ranges = [r for r in self.ranges if forget_before is None or r.newest >= forget_before] + seen.ranges
        index.committed(version, seen, forget_before)


def check(index: DedupIndex, ids: list[str], stamp: int = 5) -> tuple[list[str], SeenIds]:
    duplicates, seen = index.check(ids, [stamp] * len(ids))
    return [ids[i] for i in duplicates], seen


def test_a_duplicate_inside_a_range_is_found_and_its_holes_are_not() -> None:
    store = FakeRanges()
    index = store.index()
    dups, seen = check(index, [f"s:3:{n}" for n in (0, 4, 5, 9, 20)])  # 1-3, 6-8, 10-19: another shard's
    assert dups == [] and [(r.low, r.high) for r in seen.ranges] == [(0, 20)]
    store.commit(index, 2, seen)
    dups, seen = check(index, [f"s:3:{n}" for n in (1, 5, 6, 9, 19, 20, 21)])
    assert dups == ["s:3:5", "s:3:9", "s:3:20"]  # inside and at the high edge; 1, 6, 19 are holes
    assert [range_ids(r) for r in seen.ranges] == [["s:3:1", "s:3:6", "s:3:19", "s:3:21"]]


def test_adjacent_ranges_of_one_prefix_each_hold_their_own_edges() -> None:
    store = FakeRanges()
    index = store.index()
    for version, numbers in ((2, range(0, 10)), (3, range(10, 20))):
        dups, seen = check(index, [f"kafka:t:0:{n}" for n in numbers])
        assert dups == []
        store.commit(index, version, seen)
    assert [(r.low, r.high) for r in store.ranges] == [(0, 9), (10, 19)]
    dups, _ = check(index, [f"kafka:t:0:{n}" for n in (-1, 0, 9, 10, 19, 20)] + ["kafka:t:1:9"])
    assert dups == ["kafka:t:0:0", "kafka:t:0:9", "kafka:t:0:10", "kafka:t:0:19"]


def test_a_repeat_within_the_batch_counts_once_and_the_first_copy_stays() -> None:
    index = FakeRanges().index()
    duplicates, seen = index.check(["s:1:4", "s:1:2", "s:1:4", "r-9", "r-9", "s:1:04"], [1, 2, 3, 4, 5, 6])
    assert duplicates == [2, 4]
    assert [range_ids(r) for r in seen.ranges] == [["s:1:2", "s:1:4"]] and seen.ranges[0].newest == 2
    assert seen.exact == [("r-9", 4), ("s:1:04", 6)]


def test_a_new_prefix_reads_no_range_and_forgotten_ranges_leave_the_index() -> None:
    store = FakeRanges()
    index = store.index()
    _, seen = check(index, ["s:1:0", "s:1:1"], stamp=10)
    store.commit(index, 2, seen)
    check(index, ["s:2:0", "s:2:1"])  # a batch never seen: certainly new, no read
    assert store.reads == 0
    assert check(index, ["s:1:1"])[0] == ["s:1:1"] and store.reads == 1
    store.commit(index, 3, SeenIds([], []), forget_before=11)  # the range's newest record (10) is garbage
    assert check(index, ["s:1:1"])[0] == [] and store.reads == 1
