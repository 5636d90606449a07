"""Every operator of headrace.operators on Spark, in each mode, against its DuckDB oracle: one
topology holds every case of tests/operator_cases.py (out-of-order input, late records held back
until the watermark has passed them, within and past each operator's allowed lateness)."""

from __future__ import annotations

from typing import Any

from headrace import run
from headrace.store import open_store

from ..operator_cases import CASES
from ..operator_topology import build, check


def test_every_operator_equals_its_oracle_on_spark(spark: Any, store_url: str, mode: str) -> None:
    run(build(store_url, seed=3), store=store_url, spark=spark, progress=None, timeout_s=600, mode=mode,
        **({"trigger_ms": 100} if mode == "microbatch" else {}))
    check(store_url, seed=3)
    store = open_store(store_url)
    for case in CASES:  # late records reached each operator, and its policy saw them
        counters = store.counters(case.named(f"{case.name}_")[0].__name__)
        assert counters.get("late_delivered" if case.cls.needs_late_records() else "late_dropped", 0) > 0, case.name
