"""A consumer's view of a key interval's head: its last journaled batch, with the output
watermark raised by its owner's quiet report. The head must keep the watermark's promise (no
record after the head's batch is older than the head's watermark), or its consumers take records
for late. Read in two statements, a producer could commit and report again between them; the two
are read in one statement, from one snapshot: the test counts the statements (PostgreSQL's count:
tests/unit/store/test_postgres_together.py) and moves the producer right after each."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from headrace.names import interval as interval_producer
from headrace.store import open_store

from .test_worker import SHARDS, Clock, publish, store, workers  # noqa: F401 - store: the fixture


def test_a_head_read_while_its_producer_commits_and_reports_keeps_the_watermark_promise(
        store: Any, tmp_path: Path) -> None:
    clock = Clock()
    owner, _ = workers(store, clock)
    clock.now += 10_000  # past a newcomer's patience: it takes every interval
    owner.maintain_leases()
    assert len(owner.owned["CountWords"]) == SHARDS
    publish(store, 1, 0, 60, 1_060)
    while owner.step():
        pass

    consumer = open_store(f"sqlite:///{tmp_path}/store.db")
    producers = [interval_producer("CountWords", i) for i in range(SHARDS)]
    raced: list[str] = []
    real_all = consumer._all

    def then_race(sql: str, params: Any = ()) -> Any:  # the producer moves right after each statement of the read
        raced.append(sql)
        out = real_all(sql, params)
        publish(store, len(raced) + 1, 60 * len(raced), 60 * len(raced) + 60, 1_060 + 60 * len(raced))
        while owner.step():
            pass
        return out
    consumer._all = then_race  # type: ignore[method-assign]
    try:
        heads = consumer.producer_heads(producers)
    finally:
        consumer._all = real_all  # type: ignore[method-assign]
    assert len(raced) == 1, f"the heads were read in {len(raced)} statements, not one: {raced}"
    for producer in producers:
        head = heads[producer]
        later = [r.timestamp for _, r in consumer.read_segments("counted", producer, head.batch, 1 << 30)]
        assert all(ts >= head.output_watermark for ts in later), (
            f"{producer}'s head is batch {head.batch} with watermark {head.output_watermark}, yet a later "
            f"batch has records at {sorted(later)[:3]}")
    consumer.close()


def test_at_most_once_output_reports_its_quiet_intervals_only_once_the_output_is_written(tmp_path: Path) -> None:
    """At-most-once output goes out after the state commit, in a transaction of its own; a pass's
    quiet report raises the watermark of every interval held under its sequencer, so it must not
    be seen before that output is: a consumer reading between the two would take it for late."""
    from headrace import Computation, Topology, injectors, key_by
    from headrace.engine.worker import Worker
    from headrace.names import CONTINUOUS
    from headrace.plans import interval_plans, producers_of

    from .test_worker import CountWords, WORDS

    t = Topology("after-state")
    t.inject("words", injectors.records([{"word": w, "ts": 1_000 + i} for i, w in enumerate(WORDS)], timestamp="ts"))
    t.add(CountWords, inputs={"words": key_by("word")}, outputs=["counted"], shards=SHARDS,
          output_semantics="at_most_once")
    url = f"sqlite:///{tmp_path}/store.db"
    store, consumer = open_store(url), open_store(url)
    store.register("CountWords", SHARDS, CONTINUOUS)
    for stream in t.streams():
        store.declare_stream(stream, *producers_of(t, stream, CONTINUOUS))
    clock = Clock()
    owner = Worker(store, interval_plans(t), "worker-a", 0, 1, lease_ms=1_000, clock=clock)
    clock.now += 10_000
    owner.maintain_leases()
    producers = [interval_producer("CountWords", i) for i in range(SHARDS)]
    seen: list[dict[str, Any]] = []

    def between(name: str) -> None:  # a consumer reads the heads between the state and the output
        if name == "output":
            seen.append(consumer.producer_heads(producers))
    store.failpoint = between
    publish(store, 1, 0, 60, 1_060)
    while owner.step():
        pass
    publish(store, 2, 60, 120, 1_120)
    while owner.step():
        pass
    assert seen, "no pass wrote at-most-once output"
    for heads in seen:
        for producer, head in heads.items():
            later = [r.timestamp for _, r in consumer.read_segments("counted", producer, head.batch, 1 << 30)]
            assert all(ts >= head.output_watermark for ts in later), (
                f"{producer}'s head is batch {head.batch} with watermark {head.output_watermark}, yet its "
                f"output written after has records at {sorted(later)[:3]}")
    store.close()
    consumer.close()
