"""Nexmark q0, q1, q2, q3, q4, q5, q7 and q8 on Spark, in each mode, against DuckDB evaluating the
same queries in SQL over the same events (examples/nexmark). CI runs 20,000 events, out of order
in groups of 500, at 500 events per second of event time (40 s: several of every window); `scripts/test --long` adds 1,000,000 events in continuous mode, where
bench/nexmark.py also checks each query's answer before printing its number."""

from __future__ import annotations

from typing import Any

import pytest

from examples.nexmark.generator import KINDS
from examples.nexmark.oracle import evaluate, tables
from examples.nexmark.queries import INPUTS, QUERIES, answer, inject
from headrace import Topology, read, run


def every_query(n: int, seed: int, out_of_order: int, batch_size: int, rate: int) -> Topology:
    t = Topology("nexmark")
    inject(t, n, seed, out_of_order, batch_size, KINDS, rate)
    for query in QUERIES.values():
        query.add(t, {"shards": 2})
    return t


def check_every_query(store_url: str, n: int, seed: int, out_of_order: int, rate: int) -> None:
    data = tables(n, seed, out_of_order, rate)
    for name, query in QUERIES.items():
        got = answer(name, list(read(query.output, store_url)))
        want = evaluate(name, data)
        assert got == want, f"{name}: {len(got)} rows, DuckDB {len(want)}; first differences: " \
                            f"{sorted(set(got) ^ set(want))[:3]}"
        assert want, f"{name} has an empty answer: it tests nothing"


def test_every_nexmark_query_equals_duckdb(spark: Any, store_url: str, mode: str) -> None:
    n, seed, disorder, rate = 20_000, 5, 500, 500
    run(every_query(n, seed, disorder, 2_000, rate), store=store_url, spark=spark, progress=None,
        timeout_s=600, mode=mode, **({"trigger_ms": 100} if mode == "microbatch" else {}))
    check_every_query(store_url, n, seed, disorder, rate)


@pytest.mark.slow
@pytest.mark.parametrize("query", sorted(QUERIES))
def test_each_nexmark_query_over_a_million_events_equals_duckdb(spark: Any, store_url: str, query: str) -> None:
    n, seed, disorder = 1_000_000, 7, 1_000
    t = Topology(f"nexmark_{query}")
    inject(t, n, seed, disorder, 50_000, INPUTS[query])
    QUERIES[query].add(t, {})
    run(t, store=store_url, spark=spark, progress=None, timeout_s=3_000)
    got = answer(query, list(read(QUERIES[query].output, store_url)))
    assert got == evaluate(query, tables(n, seed, disorder))
