"""spark/driver.py: the driver trims the bus every ``trim_every_s`` on a fixed schedule from its
first trim, so the trims keep their phase against the pipeline's own periodic work (windows that
close every few seconds) instead of drifting across it; a trim that overran slots skips them."""

from __future__ import annotations

from headrace.spark.driver import Driver


class Schedule(Driver):
    """A driver's schedule alone: ``trim`` notes when it ran and takes ``took`` seconds."""

    def __init__(self, took: list[float]) -> None:  # no Spark, no store: only ``_tick`` runs
        self.trim_every_s, self._next_trim, self.now, self.took, self.ran = 10.0, 0.0, 1_000.0, took, []

    def clock(self) -> float:  # type: ignore[override]
        return self.now

    def trim(self) -> None:  # type: ignore[override]
        self.ran.append(self.now)
        self.now += self.took.pop(0) if self.took else 3.0


def test_trims_keep_a_fixed_schedule_whatever_the_wait_loop_granularity_and_skip_overrun_slots() -> None:
    driver = Schedule(took=[3.0, 3.0, 3.0, 25.0])
    while driver.now < 1_075.0:
        driver._tick()
        driver.now += 0.37  # the wait loop's step: a schedule timed from each trim would drift by it
    slots = [0.0, 10.0, 20.0, 30.0, 60.0, 70.0]  # the trim at 30 s ran 25 s: the slots at 40 and 50 s are skipped
    assert len(driver.ran) == len(slots), driver.ran
    for slot, ran in zip(slots, driver.ran):  # at the first tick of the wait loop after its slot, never later
        assert 0.0 <= ran - 1_000.0 - slot < 0.37, (slot, driver.ran)
