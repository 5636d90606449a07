from __future__ import annotations

from typing import Any

import pytest

from headrace import read, run, watermarks
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME
from headrace.store import open_store

from .pipelines import oracle, searches, three_stage


def test_three_stage_pipeline_equals_the_oracle_with_out_of_order_input(spark: Any, each_store: str,
                                                                        mode: str) -> None:
    store_url = each_store
    events = searches(3_000)
    assert any(a["ts"] > b["ts"] for a, b in zip(events, events[1:])), "input must be out of order"
    result = run(three_stage(events), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)

    expected = oracle(events)
    window = {(r.value["query"], r.value["bucket"]): r.value["count"] for r in read("window_counts", store_url)}
    totals = {r.value["bucket"]: {"searches": r.value["searches"], "queries": r.value["queries"]}
              for r in read("bucket_totals", store_url)}
    busiest = {r.value["span"]: {"bucket": r.value["bucket"], "searches": r.value["searches"]}
               for r in read("busiest", store_url)}
    assert window == expected["window_counts"]
    assert totals == expected["bucket_totals"]
    assert busiest == expected["busiest"]
    assert len(list(read("window_counts", store_url))) == len(expected["window_counts"])  # each window emitted once
    assert result.stats["WindowCounter"].counters.get("late_dropped", 0) == 0
    assert all(info.output_watermark == END_OF_TIME for info in watermarks(store_url).values())
    if mode == "continuous":
        journals_move_forward_and_never_pass_the_injector(store_url)


def journals_move_forward_and_never_pass_the_injector(store_url: str) -> None:
    """Continuous mode: every interval's journaled watermarks and its authority's only move forward,
    and a first-stage interval's input watermark is never ahead of what the injector had journaled
    by its commit (the watermark's promise; later stages also hear quiet reports, not journaled)."""
    store = open_store(store_url)
    try:
        for stage, shards in (("WindowCounter", 3), ("BucketTotals", 2), ("BusiestBucketPerTenSeconds", 2)):
            assert store.batches(stage), f"the authority journaled nothing of {stage}"
            for producer in [stage, *(f"{stage}/{i}" for i in range(shards))]:  # a quiet interval journals nothing
                journal = store.batches(producer)
                ins, outs = [b.input_watermark for b in journal], [b.output_watermark for b in journal]
                assert ins == sorted(ins) and outs == sorted(outs), f"{producer}'s watermark moved back"
        injected = store.batches("inject:searches")
        assert injected and all(store.batches(f"WindowCounter/{i}") for i in range(3))
        for i in range(3):
            for b in store.batches(f"WindowCounter/{i}"):
                promised = max((u.output_watermark for u in injected if u.completed_at <= b.completed_at),
                               default=BEGINNING_OF_TIME)
                assert b.input_watermark <= promised, f"WindowCounter/{i} batch {b.batch} passed the injector"
    finally:
        store.close()


@pytest.mark.parametrize("state, output", [("exactly_once", "at_most_once"), ("at_most_once", "at_most_once")])
def test_at_most_once_semantics_lose_nothing_when_nothing_fails(spark: Any, store_url: str, mode: str, state: str,
                                                               output: str) -> None:
    # (tests/unit/store/test_semantics_under_kills.py shows what each semantics does under kills)
    events = searches(1_500, seed=5)
    run(three_stage(events, name="at_most_once", state_semantics=state, output_semantics=output), store=store_url,
        spark=spark, progress=None, timeout_s=300, mode=mode)
    expected = oracle(events)
    assert {(r.value["query"], r.value["bucket"]): r.value["count"] for r in read("window_counts", store_url)} \
        == expected["window_counts"]
    assert {r.value["span"]: {"bucket": r.value["bucket"], "searches": r.value["searches"]}
            for r in read("busiest", store_url)} == expected["busiest"]


def test_every_stage_watermark_is_monotonic_and_lags_its_producer_by_at_most_one_batch(spark: Any, store_url: str) -> None:
    events = searches(2_000, seed=5)
    topology = three_stage(events, batch_size=50, name="lagging", rate=200)
    run(topology, store=store_url, spark=spark, progress=None, timeout_s=300, trigger_ms=100, mode="microbatch")

    store = open_store(store_url)
    stages = {"WindowCounter": "inject:searches", "BucketTotals": "WindowCounter",
              "BusiestBucketPerTenSeconds": "BucketTotals"}
    for stage, producer in stages.items():
        journal = store.batches(stage)
        upstream = store.batches(producer)
        outs = [b.output_watermark for b in journal]
        ins = [b.input_watermark for b in journal]
        assert outs == sorted(outs) and ins == sorted(ins), f"{stage} watermark moved back"
        assert len(journal) >= 3, f"{stage} ran only {len(journal)} batches; the test needs a steady state"
        for previous, current in zip(journal, journal[1:]):
            # everything the producer completed before our previous batch ended was visible to this batch
            visible = [u.output_watermark for u in upstream if u.completed_at < previous.completed_at]
            if visible:
                assert current.input_watermark >= max(visible), (
                    f"{stage} batch {current.batch} is more than one batch behind {producer}")
