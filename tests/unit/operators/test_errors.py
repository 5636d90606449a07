"""Operator settings that cannot work are refused where the operator is added, word for word."""

from __future__ import annotations

import re
from typing import Any

import pytest

from headrace import Topology, injectors, key_by
from headrace.errors import OptionError, UserCodeError
from headrace.operators import Deduplicate, IntervalJoin, LookupJoin, TumblingWindow
from headrace.testing import Harness

from ...operator_cases import Counting


class Count(Counting, TumblingWindow):
    def emit(self, ctx: Any, window: Any, count: int) -> None:
        ctx.produce("counts", {"count": count})


def test_a_window_without_a_size_is_refused_where_it_is_added() -> None:
    t = Topology("errors")
    t.inject("events", injectors.records([{"k": "a", "ts": 0}], timestamp="ts"))
    with pytest.raises(OptionError, match=re.escape(
            "TumblingWindow 'Count' needs size_ms, in milliseconds, an int >= 1 (got 0). "
            "Hint: set it in the class: size_ms = 60_000")):
        t.add(Count, inputs={"events": key_by("k")}, outputs=["counts"])


def test_a_window_that_handles_late_records_refuses_late_drop() -> None:
    class Late(Count):
        size_ms, allowed_lateness_ms = 1_000, 5_000

    with pytest.raises(OptionError, match=re.escape(
            "TumblingWindow 'Late' handles late records itself (allowed_lateness_ms or late_stream is set), so it "
            "needs late='deliver' (got 'drop'). Hint: leave the late option out (the operator sets it), or set "
            "allowed_lateness_ms = 0 and late_stream = None to let the engine drop them")):
        Harness(Late, late="drop")
    assert Harness(Late).options.late == "deliver"  # set for it when left out
    assert Harness(type("OnTime", (Count,), {"size_ms": 1_000})).options.late == "drop"


def test_a_window_missing_a_hook_names_it() -> None:
    class NoEmit(TumblingWindow):
        size_ms = 1_000

        def zero(self) -> int:
            return 0

    with pytest.raises(OptionError, match=re.escape(
            "TumblingWindow 'NoEmit' does not define lift, combine, emit (got <class")):
        Harness(NoEmit)


def test_a_join_of_a_stream_with_itself_and_an_empty_interval_are_refused() -> None:
    class Self(IntervalJoin):
        left = right = "clicks"

    with pytest.raises(OptionError, match=re.escape(
            "IntervalJoin 'Self' joins two different streams (got ('clicks', 'clicks')). Hint: to join a stream "
            "with itself, key a copy of it into a stream of its own")):
        Harness(Self)

    class Empty(IntervalJoin):
        left, right, lower_ms, upper_ms = "views", "clicks", 0, -5

        def join(self, ctx: Any, left: Any, right: Any) -> None:
            pass

    with pytest.raises(OptionError, match=re.escape(
            "IntervalJoin 'Empty' has upper_ms below lower_ms: nothing could match (got (0, -5)). "
            "Hint: lower_ms <= upper_ms")):
        Harness(Empty)


def test_a_record_of_a_stream_the_join_does_not_name_fails_its_batch_with_the_streams() -> None:
    class Enrich(LookupJoin):
        table, stream = "users", "clicks"

        def join(self, ctx: Any, record: Any, row: Any) -> None:
            pass

    h = Harness(Enrich)
    with pytest.raises(UserCodeError, match=re.escape(
            "LookupJoin 'Enrich' got a record of stream 'input', which is none of its inputs ['clicks', 'users'] "
            "(got {'page': '/'}). Hint: subscribe it to exactly the streams its class names, e.g. "
            "inputs={'clicks': key_by(...), 'users': key_by(...)}")):
        h.process("u1", {"page": "/"}, 1_000)
    assert h.state("u1") is None  # the batch was not committed


def test_dedup_without_emit_and_a_counter_of_the_engine_are_refused() -> None:
    class Quiet(Deduplicate):
        within_ms = 10

    with pytest.raises(OptionError, match=re.escape(
            "Deduplicate 'Quiet' does not define emit (got <class")):
        Harness(Quiet)

    class Cheat(Count):
        size_ms = 10

        def emit(self, ctx: Any, window: Any, count: int) -> None:
            ctx.count("records", count)

    h = Harness(Cheat)
    h.process("k", {}, 5)
    with pytest.raises(UserCodeError, match=re.escape(
            "ctx.count takes a counter name of your own and an int (got ('records', 1)). Hint: e.g. "
            "ctx.count('too_late'); the engine's own counters ['dead_lettered', 'duplicates', 'late_delivered', "
            "'late_dropped', 'late_productions', 'records', 'state_expired', 'timers_fired'] are its to keep")):
        h.advance_watermark(10)
