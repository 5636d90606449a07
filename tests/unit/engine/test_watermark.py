"""engine/watermark.py: the low watermark arithmetic of docs/architecture.md §2.4 (monotonic, bounded by holds)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from headrace.engine.watermark import injector_low_watermark, input_low_watermark, is_late, output_low_watermark
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME

# Ordinary millisecond stamps plus the two ends of time, which the engine really passes around.
stamps = st.one_of(st.integers(-10**13, 10**13), st.sampled_from([BEGINNING_OF_TIME, END_OF_TIME, 0]))
holds_lists = st.lists(stamps, max_size=6)


class FakeClock:
    """An injected clock: returns ``now`` and counts how often it was read."""

    def __init__(self, now: int = 0) -> None:
        self.now = now
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now


# -- output_low_watermark ---------------------------------------------------------------------------


@given(previous=stamps, input_wm=stamps, holds=holds_lists)
def test_output_watermark_never_moves_back(previous: int, input_wm: int, holds: list[int]) -> None:
    assert output_low_watermark(previous, input_wm, holds) >= previous


@given(previous=stamps, input_wm=stamps, holds=holds_lists)
def test_output_watermark_never_passes_a_hold_or_the_input(previous: int, input_wm: int, holds: list[int]) -> None:
    bound = min([input_wm, *holds])
    result = output_low_watermark(previous, input_wm, holds)
    if previous <= bound:
        assert result <= input_wm
        assert all(result <= h for h in holds)
        assert result == bound  # and it does advance all the way to the bound
    else:
        assert result == previous  # a hold already behind what was published cannot pull it back


@given(previous=stamps, input_wm=stamps, holds=holds_lists)
def test_output_watermark_is_max_of_previous_and_the_bound(previous: int, input_wm: int, holds: list[int]) -> None:
    assert output_low_watermark(previous, input_wm, holds) == max(previous, min([input_wm, *holds]))


@given(previous=stamps, input_wm=stamps, holds=holds_lists)
def test_output_watermark_accepts_holds_as_any_iterable(previous: int, input_wm: int, holds: list[int]) -> None:
    expected = output_low_watermark(previous, input_wm, list(holds))
    assert output_low_watermark(previous, input_wm, iter(holds)) == expected
    assert output_low_watermark(previous, input_wm, tuple(holds)) == expected


def test_output_watermark_examples() -> None:
    assert output_low_watermark(BEGINNING_OF_TIME, 500) == 500
    assert output_low_watermark(BEGINNING_OF_TIME, 500, [200, 300]) == 200  # the oldest hold wins
    assert output_low_watermark(250, 500, [200]) == 250  # a hold behind what is published: stays put
    assert output_low_watermark(100, 50, []) == 100  # an input behind what is published: stays put
    assert output_low_watermark(0, END_OF_TIME, []) == END_OF_TIME  # drained input, no work: end of time


@given(steps=st.lists(st.tuples(stamps, holds_lists), min_size=1, max_size=40))
def test_a_sequence_of_inputs_and_holds_gives_a_non_decreasing_series(steps: list[tuple[int, list[int]]]) -> None:
    series, current = [], BEGINNING_OF_TIME
    for input_wm, holds in steps:
        current = output_low_watermark(current, input_wm, holds)
        series.append(current)
    assert all(a <= b for a, b in zip(series, series[1:]))
    # the series is exactly the running maximum of the per-step bounds
    bounds = [min([i, *h]) for i, h in steps]
    assert series == [max([BEGINNING_OF_TIME, *bounds[: n + 1]]) for n in range(len(steps))]


class OutputWatermarkMachine(RuleBasedStateMachine):
    """A computation's life: its input watermark moves forward, work (holds) arrives and finishes."""

    @initialize(start=st.integers(-10**6, 10**6))
    def start(self, start: int) -> None:
        self.input_wm = start
        self.holds: list[int] = []
        self.published = BEGINNING_OF_TIME
        self.series = [self.published]
        self.previous_at_step = BEGINNING_OF_TIME

    def _step(self) -> None:
        self.previous_at_step = self.published
        self.published = output_low_watermark(self.published, self.input_wm, self.holds)
        self.series.append(self.published)

    @rule(by=st.integers(0, 10**5))
    def advance_input(self, by: int) -> None:
        self.input_wm += by
        self._step()

    @rule(jump=st.integers(-10**5, 10**5))
    def input_jumps_anywhere(self, jump: int) -> None:  # even a regressing input must not pull it back
        self.input_wm += jump
        self._step()

    @rule(offset=st.integers(-10**5, 10**6))
    def add_hold(self, offset: int) -> None:
        self.holds.append(self.input_wm + offset)
        self._step()

    @precondition(lambda self: bool(self.holds))
    @rule(index=st.integers(0, 100))
    def finish_work(self, index: int) -> None:
        self.holds.pop(index % len(self.holds))
        self._step()

    @invariant()
    def never_moves_back(self) -> None:
        assert all(a <= b for a, b in zip(self.series, self.series[1:]))

    @invariant()
    def never_passes_input_or_hold_unless_already_past(self) -> None:
        bound = min([self.input_wm, *self.holds])
        if self.previous_at_step <= bound:
            assert self.published <= bound


OutputWatermarkMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestOutputWatermarkMachine = OutputWatermarkMachine.TestCase


# -- input_low_watermark ----------------------------------------------------------------------------


@given(marks=st.lists(stamps, min_size=1, max_size=8))
def test_input_watermark_is_the_minimum_of_the_producers(marks: list[int]) -> None:
    result = input_low_watermark(marks)
    assert result in marks
    assert all(result <= m for m in marks)
    assert input_low_watermark(iter(marks)) == result  # a generator of producers works too


def test_input_watermark_with_no_producer_is_the_end_of_time() -> None:
    assert input_low_watermark([]) == END_OF_TIME
    assert input_low_watermark(iter(())) == END_OF_TIME


def test_input_watermark_is_held_back_by_the_slowest_producer() -> None:
    assert input_low_watermark([END_OF_TIME, 1_000, 5_000]) == 1_000
    assert input_low_watermark([END_OF_TIME, END_OF_TIME]) == END_OF_TIME  # every producer drained


# -- injector_low_watermark -------------------------------------------------------------------------

clock_steps = st.lists(
    st.tuples(st.integers(0, 10**12), st.lists(st.integers(0, 10**12), max_size=4)), min_size=1, max_size=30)


@settings(max_examples=200)
@given(steps=clock_steps, delay=st.integers(0, 10**7))
def test_injector_watermark_never_moves_back(steps: list[tuple[int, list[int]]], delay: int) -> None:
    clock, current = FakeClock(), BEGINNING_OF_TIME
    for now, unfinished in steps:  # the clock may even jump backwards (NTP), the watermark may not
        clock.now = now
        new = injector_low_watermark(current, unfinished, clock, delay)
        assert new >= current
        current = new


@given(steps=clock_steps, delay=st.integers(0, 10**7))
def test_injector_watermark_holds_at_the_oldest_unfinished(steps: list[tuple[int, list[int]]], delay: int) -> None:
    clock, current = FakeClock(), BEGINNING_OF_TIME
    for now, unfinished in steps:
        clock.now = now
        new = injector_low_watermark(current, unfinished, clock, delay)
        if unfinished:
            assert new == max(current, min(unfinished))  # the clock does not matter while work is pending
            if current <= min(unfinished):
                assert new == min(unfinished)
        else:
            assert new == max(current, now - delay)
        current = new


def test_injector_watermark_ignores_a_clock_far_ahead_while_work_is_unfinished() -> None:
    clock = FakeClock(now=10**12)
    assert injector_low_watermark(BEGINNING_OF_TIME, [5_000, 3_000, 9_000], clock, 1_000) == 3_000
    assert injector_low_watermark(3_000, [], clock, 1_000) == 10**12 - 1_000  # done: the clock minus the delay
    assert clock.reads == 1


@given(previous=stamps, unfinished=st.lists(stamps, max_size=4), now=st.integers(0, 10**12))
def test_injector_watermark_is_end_of_time_once_exhausted(previous: int, unfinished: list[int], now: int) -> None:
    clock = FakeClock(now)
    assert injector_low_watermark(previous, unfinished, clock, 0, exhausted=True) == END_OF_TIME
    # and it stays there: a later step (exhausted or not) never moves back from the end of time
    assert injector_low_watermark(END_OF_TIME, unfinished, clock, 0) == END_OF_TIME


def test_injector_watermark_with_a_real_sequence() -> None:
    clock, wm = FakeClock(1_000), BEGINNING_OF_TIME
    wm = injector_low_watermark(wm, [], clock, 100)
    assert wm == 900
    clock.now = 2_000
    wm = injector_low_watermark(wm, [1_500, 1_200], clock, 100)
    assert wm == 1_200
    wm = injector_low_watermark(wm, [1_500], clock, 100)
    assert wm == 1_500
    clock.now = 1_000  # the clock steps back
    wm = injector_low_watermark(wm, [], clock, 100)
    assert wm == 1_500
    assert injector_low_watermark(wm, [], clock, 100, exhausted=True) == END_OF_TIME


def test_is_late_is_strictly_behind_the_watermark() -> None:
    assert is_late(99, 100)
    assert not is_late(100, 100)
    assert not is_late(101, 100)
    assert not is_late(BEGINNING_OF_TIME, BEGINNING_OF_TIME)


# -- the percentile low watermark (MillWheel §7.2) ---------------------------------------------------

percentiles = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)


@given(marks=st.lists(stamps, min_size=1, max_size=30))
def test_at_one_hundred_percent_it_is_the_true_low_watermark(marks: list[int]) -> None:
    assert input_low_watermark(marks, 100.0) == input_low_watermark(marks) == min(marks)


@given(marks=st.lists(stamps, min_size=1, max_size=30), percentile=percentiles)
def test_a_percentile_watermark_ignores_only_the_slowest_share_of_producers(marks: list[int], percentile: float) -> None:
    result = input_low_watermark(marks, percentile)
    assert result in marks
    behind = sum(1 for m in marks if m < result)
    assert behind <= len(marks) * (100.0 - percentile) / 100.0  # never more stragglers than the share allows
    # and it ignores no producer it need not: every producer it does not wait for is strictly behind it,
    # and one more straggler would have been more than the share allows
    assert behind == len(marks) - 1 or sum(1 for m in marks if m <= result) > len(marks) * (100.0 - percentile) / 100.0


@given(marks=st.lists(stamps, min_size=1, max_size=30), low=percentiles, high=percentiles)
def test_a_higher_percentile_never_gives_a_later_watermark(marks: list[int], low: float, high: float) -> None:
    low, high = min(low, high), max(low, high)
    assert input_low_watermark(marks, high) <= input_low_watermark(marks, low)


def test_ninety_nine_percent_of_two_hundred_producers_ignores_the_two_slowest() -> None:
    marks = [5, 7] + [100 + i for i in range(198)]
    assert input_low_watermark(marks, 99.0) == 100
    assert input_low_watermark(marks, 99.5) == 7
    assert input_low_watermark(marks[:4], 99.0) == 5  # too few producers to ignore any
