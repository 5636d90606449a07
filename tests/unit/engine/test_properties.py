"""Property tests: watermarks never move back nor pass a hold; timers fire once, in order, never early."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace import Computation
from headrace.engine.watermark import injector_low_watermark, input_low_watermark, output_low_watermark
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME
from headrace.testing import Harness

stamps = st.integers(min_value=-10**12, max_value=10**12)


@given(previous=stamps, input_wm=stamps, holds=st.lists(stamps, max_size=5))
def test_output_watermark_never_moves_back_and_never_passes_a_hold(previous: int, input_wm: int,
                                                                    holds: list[int]) -> None:
    result = output_low_watermark(previous, input_wm, holds)
    assert result >= previous
    bound = min([input_wm, *holds])
    if previous <= bound:
        assert result == bound
    else:
        assert result == previous


@given(steps=st.lists(st.tuples(stamps, st.lists(stamps, max_size=3)), min_size=1, max_size=30))
def test_a_series_of_output_watermarks_is_non_decreasing(steps: list[tuple[int, list[int]]]) -> None:
    series, current = [], BEGINNING_OF_TIME
    for input_wm, holds in steps:
        current = output_low_watermark(current, input_wm, holds)
        series.append(current)
    assert series == sorted(series)


@given(marks=st.lists(stamps, max_size=6))
def test_input_watermark_is_the_minimum_over_producers(marks: list[int]) -> None:
    assert input_low_watermark(marks) == (min(marks) if marks else END_OF_TIME)


@given(steps=st.lists(st.tuples(st.integers(0, 10**9), st.lists(st.integers(0, 10**9), max_size=3)),
                      min_size=1, max_size=25),
       delay=st.integers(0, 10_000))
def test_injector_watermark_with_an_injected_clock(steps: list[tuple[int, list[int]]], delay: int) -> None:
    current = BEGINNING_OF_TIME
    for now, unfinished in steps:
        new = injector_low_watermark(current, unfinished, lambda: now, delay)
        assert new >= current
        expected = min(unfinished) if unfinished else now - delay
        assert new == max(current, expected)
        current = new
    assert injector_low_watermark(current, [1], lambda: 0, delay, exhausted=True) == END_OF_TIME


class FireLog(Computation):
    """Sets a timer per record (tag = its timestamp) and reports every firing with what it had seen."""

    def process_record(self, ctx: Any, record: Any) -> None:
        seen = ctx.state or []
        ctx.state = [*seen, record.timestamp]
        ctx.set_timer(f"t{record.value}", record.value)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("fired", {"at": timer.timestamp, "tag": timer.tag, "seen": list(ctx.state),
                              "watermark": ctx.low_watermark})


@settings(max_examples=25, deadline=None)
@given(timers=st.lists(st.integers(0, 1_000), min_size=1, max_size=12, unique=True),
       records_at=st.lists(st.integers(0, 1_000), max_size=8),
       advances=st.lists(st.integers(0, 1_100), min_size=1, max_size=6))
def test_watermark_timers_fire_once_in_order_never_early_and_after_earlier_records(
        timers: list[int], records_at: list[int], advances: list[int]) -> None:
    h = Harness(FireLog, shards=2)
    for i, t in enumerate(timers):
        h.process("k", t, records_at[i % len(records_at)] if records_at else 0)
    watermark = BEGINNING_OF_TIME
    for target in sorted(advances):
        for record in h.advance_watermark(target):
            assert record.value["at"] <= target  # never before the watermark reached it
            assert record.value["watermark"] == target
        watermark = target
    fired = [r.value["at"] for r in h.productions("fired")]
    assert fired == sorted(fired)  # increasing timestamp order
    assert sorted(fired) == sorted(t for t in timers if t <= watermark)  # each due timer exactly once
    assert [t.timestamp for t in h.timers("k")] == sorted(t for t in timers if t > watermark)
    given_records = sorted(records_at[i % len(records_at)] if records_at else 0 for i in range(len(timers)))
    for record in h.productions("fired"):
        # every record with a timestamp below the timer's was processed before it fired
        assert sorted(ts for ts in record.value["seen"] if ts < record.value["at"]) == \
            [ts for ts in given_records if ts < record.value["at"]]
