"""Liveness (issue 23): a timer handler that re-arms itself at or below the watermark is stopped
with an error naming the key, and ``process_timeout_s`` stops an invocation that runs too long;
each is dead-lettered or fails under ``on_error``, and the batch commits."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from headrace import Computation
from headrace.engine.failures import TIMER_REFIRE_LIMIT
from headrace.errors import OptionError, UserCodeError
from headrace.testing import Harness


class Rearm(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.set_timer("tick", record.timestamp)
        ctx.set_timer("fine", record.timestamp)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.count("fired")
        if timer.tag == "tick" and ctx.key == "loop":
            ctx.set_timer("tick", timer.timestamp)  # due again at once: forever, on the old code
        else:
            ctx.produce("done", ctx.key)


def test_a_timer_that_re_arms_itself_at_the_same_time_is_dead_lettered_naming_the_key() -> None:
    h = Harness(Rearm, on_error="dead_letter")
    h.process("loop", "v", 10)
    h.process("calm", "v", 10)
    h.advance_watermark(100)
    [dead] = h.productions("Rearm.dead_letter")
    assert dead.value["key"] == "loop" and dead.value["at"] == "watermark timer 'tick' at 10"
    assert dead.value["error"].startswith(f"TimerLoopError: Key 'loop' fired more than {TIMER_REFIRE_LIMIT} timers "
                                          f"in one batch at or before a time it had already fired a timer at")
    assert sorted(r.value for r in h.productions("done")) == ["calm", "calm", "loop"]  # the other timers still fired
    assert h.timers("loop") == []
    assert h.counters["fired"] == TIMER_REFIRE_LIMIT + 3  # the looping handler ran only up to the bound


def test_under_on_error_fail_a_re_arm_loop_stops_with_the_key_named() -> None:
    h = Harness(Rearm)
    h.process("loop", "v", 10)
    with pytest.raises(UserCodeError, match=r"^Computation 'Rearm' failed on key 'loop' at watermark timer 'tick' at "
                                            r"10: Key 'loop' fired more than 10000 timers in one batch"):
        h.advance_watermark(100)


def test_a_timer_re_armed_a_step_later_each_time_is_not_a_loop() -> None:
    class Periodic(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.set_timer("tick", 0)

        def process_timer(self, ctx: Any, timer: Any) -> None:
            ctx.count("ticks")
            ctx.set_timer("tick", timer.timestamp + 1)

    h = Harness(Periodic)
    h.process("k", "v", 0)
    h.advance_watermark(3 * TIMER_REFIRE_LIMIT)
    assert h.counters["ticks"] == 3 * TIMER_REFIRE_LIMIT + 1


class Slow(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("seen", record.value)
        if record.value == "spin":
            while True:  # never returns on its own
                try:
                    pass
                except Exception:  # noqa: S110 - a handler of its own does not swallow the watchdog
                    pass
        if record.value == "sleep":
            time.sleep(3600)


@pytest.mark.parametrize("value", ["spin", "sleep"])
def test_a_record_whose_user_code_runs_too_long_is_dead_lettered(value: str) -> None:
    h = Harness(Slow, on_error="dead_letter", process_timeout_s=0.2)
    started = time.monotonic()
    h.process("k", value, 10, id="slow-1")
    h.process("k", "quick", 11)
    assert time.monotonic() - started < 5
    [dead] = h.productions("Slow.dead_letter")
    assert dead.value["record_id"] == "slow-1" and dead.value["key"] == "k"
    assert dead.value["error"] == ("ProcessTimeoutError: process_record ran longer than process_timeout_s=0.2 "
                                   "(got stopped after 0.2 s). Hint: make it faster, or raise process_timeout_s")
    assert [r.value for r in h.productions("seen")] == ["quick"]


def test_under_on_error_fail_the_watchdog_stops_the_batch_naming_key_and_record() -> None:
    h = Harness(Slow, process_timeout_s=0.2)
    with pytest.raises(UserCodeError, match=r"^Computation 'Slow' failed on key 'k' at record 'slow-1' "
                                            r"\(timestamp 10\): process_record ran longer than process_timeout_s=0.2"):
        h.process("k", "spin", 10, id="slow-1")


def test_the_watchdog_works_off_the_main_thread_too() -> None:
    h = Harness(Slow, on_error="dead_letter", process_timeout_s=0.2)
    thread = threading.Thread(target=h.process, args=("k", "spin", 10, "slow-1"))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    [dead] = h.productions("Slow.dead_letter")
    assert dead.value["record_id"] == "slow-1"


def test_a_bad_process_timeout_is_refused() -> None:
    with pytest.raises(OptionError, match=r"option 'process_timeout_s' must be a number of seconds > 0 or None"):
        Harness(Slow, process_timeout_s=0)


def test_the_watchdog_puts_back_an_alarm_that_was_set_before_it() -> None:
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        h = Harness(Slow, on_error="dead_letter", process_timeout_s=5)
        h.process("k", "quick", 10)
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 30 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
