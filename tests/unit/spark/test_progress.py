"""The progress queries' source (``spark/progress.py``) without Spark: a status row goes out when a
computation's numbers changed, and only then; the runners' switch is checked."""

from __future__ import annotations

import re
from typing import Any

import pytest

from headrace import Computation
from headrace.errors import OptionError
from headrace.spark.progress import METRICS, StatusReader, check_progress_queries
from headrace.testing import Harness


class Picky(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value == "bad":
            raise ValueError("bad")
        ctx.state = (ctx.state or 0) + 1


def test_a_status_row_goes_out_when_the_numbers_change_and_only_then(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    h = Harness(Picky, store=url, on_error="dead_letter")
    reader = StatusReader({"store": url, "computation": "Picky"})
    try:
        h.process("k", "ok", 100)
        h.advance_watermark(150)
        h.process("k", "late", 120)
        h.process("k", "bad", 200)
        rows, offset = reader.read(reader.initialOffset())
        row = dict(zip(METRICS, next(iter(rows))))
        assert {k: row[k] for k in ("watermark", "records", "late_dropped", "late_delivered", "dead_letters")} == {
            "watermark": 150, "records": 2, "late_dropped": 1, "late_delivered": 0, "dead_letters": 1}
        assert offset["n"] == 1
        rows, same = reader.read(offset)
        assert list(rows) == [] and same == offset, "nothing changed: no row, no new offset"
        h.advance_watermark(300)
        rows, moved = reader.read(offset)
        assert [dict(zip(METRICS, r))["watermark"] for r in rows] == [300] and moved["n"] == 2
    finally:
        reader.stop()


def test_progress_queries_is_a_bool() -> None:
    assert check_progress_queries(False) is False
    assert check_progress_queries(True) is True
    with pytest.raises(OptionError, match="^" + re.escape(
            "progress_queries is True (each computation's numbers in Spark's progress events) or False (got 'no'). "
            "Hint: progress_queries=False runs no progress query") + "$"):
        check_progress_queries("no")
