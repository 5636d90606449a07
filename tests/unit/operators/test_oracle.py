"""Every operator on the harness, against its DuckDB oracle (tests/operator_cases.py): out-of-order
input, late records within and past the allowed lateness, and the end of the input."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.model import BEGINNING_OF_TIME, END_OF_TIME
from headrace.testing import Harness

from ...operator_cases import CASES, DISORDER, Case, oracle, t_late


def run_on_harness(case: Case, seed: int) -> tuple[Harness, list[Any]]:
    """The case's records in arrival order, the streams taking turns, the watermark trailing each
    stream's newest timestamp by ``DISORDER`` as the Spark injectors' does; ``T_LATE`` for phase 2."""
    data = case.data(seed)
    h = Harness(case.cls, **case.options)
    high = {s: BEGINNING_OF_TIME for s in data}
    late_at = t_late(data)
    for phase in (1, 2, 3):
        queues = {s: [r for r in rs if r["phase"] == phase] for s, rs in data.items()}
        while any(queues.values()):
            for stream, queue in queues.items():
                if not queue:
                    continue
                r = queue.pop(0)
                h.process(r["k"], r, r["ts"], stream=stream)
                if phase != 2:
                    high[stream] = max(high[stream], r["ts"])
                    mark = min(high.values()) - DISORDER if phase == 3 or min(high.values()) > BEGINNING_OF_TIME else None
                    if mark is not None and mark > h.low_watermark:
                        h.advance_watermark(min(mark, late_at) if phase == 1 else mark)
        if phase == 1:
            assert h.low_watermark == late_at
    h.advance_watermark(END_OF_TIME)
    return h, h.productions("out")


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_operator_equals_its_sql_oracle_on_the_harness(case: Case, seed: int) -> None:
    h, out = run_on_harness(case, seed)
    assert case.observe(out) == oracle(case, seed)
    assert out, "the case produced nothing: it tests nothing"
    if getattr(case.cls, "allowed_lateness_ms", 0):
        assert len(out) > len(case.observe(out)), "no late record updated a window: the lateness is untested"
    if case.cls.needs_late_records():
        assert h.counters.get("late_delivered", 0) > 0
    else:
        assert h.counters.get("late_dropped", 0) > 0
    if case.late_sql is not None:
        assert case.late_side is not None
        assert case.late_side(h.productions("too_late")) == oracle(case, seed, case.late_sql)
        assert h.productions("too_late"), "no record was too late: the policy is untested"
    assert h.state("a") is None and h.timers("a") == []  # state is bounded: nothing left at the end of time
