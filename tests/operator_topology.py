"""Every operator case of tests/operator_cases.py in one topology, its streams prefixed by the case's
name, fed by injectors that hold phase 2 back until the case's watermark has reached ``T_LATE``.
The Spark tests run it in each mode; the kill test runs it as a driver script:

    python operator_topology.py STORE_URL MODE SEED [RATE]
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterator

from headrace import Topology, injectors, read, watermarks

try:
    from .operator_cases import BATCH, CASES, DISORDER, Case, oracle, t_late
except ImportError:  # run as a script
    from operator_cases import BATCH, CASES, DISORDER, Case, oracle, t_late  # type: ignore[no-redef]


def held_back(rows: list[dict[str, Any]], store_url: str, computation: str, late_at: int,
              timeout_s: float = 300) -> Callable[[], Iterator[dict[str, Any]]]:
    """Phase 1, then, once ``computation``'s input watermark reached ``late_at``, the rest."""
    def source() -> Iterator[dict[str, Any]]:
        yield from (r for r in rows if r["phase"] == 1)
        deadline = time.time() + timeout_s
        while True:
            marks = watermarks(store_url)
            if computation in marks and marks[computation].input_watermark >= late_at:
                break
            if time.time() > deadline:
                raise TimeoutError(f"{computation} never reached watermark {late_at}")
            time.sleep(0.05)
        yield from (r for r in rows if r["phase"] != 1)
    return source


def build(store_url: str, seed: int, rate: float | None = None, cases: list[Case] = CASES) -> Topology:
    t = Topology("operators")
    for case in cases:
        prefix = f"{case.name}_"
        cls, inputs, outputs = case.named(prefix)
        data = case.data(seed)
        late_at = t_late(data)
        for stream, rows in data.items():
            t.inject(f"{prefix}{stream}", injectors.records(held_back(rows, store_url, cls.__name__, late_at),
                                                           timestamp="ts", batch_size=BATCH, max_delay_ms=DISORDER,
                                                           rate=rate))
        t.add(cls, inputs=inputs, outputs=outputs, **{"shards": 2, **case.options})
    return t


def check(store_url: str, seed: int, cases: list[Case] = CASES) -> None:
    """Every case's output (and late stream) read back equals its DuckDB oracle."""
    for case in cases:
        out = list(read(f"{case.name}_out", store_url))
        assert case.observe(out) == oracle(case, seed), case.name
        if case.late_sql is not None and case.late_side is not None:
            assert case.late_side(list(read(f"{case.name}_too_late", store_url))) == oracle(case, seed, case.late_sql)


if __name__ == "__main__":
    from headrace import run

    store, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else None
    run(build(store, seed, rate), store=store, master="local[2,100]", progress=None, mode=mode)
    print("drained", flush=True)
