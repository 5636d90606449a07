"""The driver's trim (spark/driver.py) without a SparkSession: a sink is a reader of its stream
from the start of the run, so retention keeps what it has not written even while it has not
started (a Kafka sink waiting for its lease or its broker), whatever the computations have read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrace import Computation, Topology, injectors, key_by
from headrace.engine.batch import Production
from headrace.spark.continuous import ContinuousRunner
from headrace.spark.kafka_sink import KafkaSink

SHARDS = 2


class Noop(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        pass


def test_a_sink_not_started_yet_holds_what_it_has_not_written_against_retention(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    t = Topology("held")
    t.inject("in", injectors.records([], timestamp="ts"))
    t.add(Noop, inputs={"in": key_by("k")}, shards=SHARDS)
    t.sink("in", kafka="out", bootstrap_servers="127.0.0.1:9")
    runner = ContinuousRunner(t, url, ui=False, retention_ms=0)
    store = runner.store
    store.register("Noop", SHARDS, "continuous")
    for batch in (1, 2):
        store.publish("inject:in", batch, {"in": [Production("in", "k", {"k": "k"}, 1_000 + batch,
                                                              f"inject:in:{batch}:0")]}, 1_000 + batch)
    for shard in range(SHARDS):
        store.record_positions("Noop", shard, {"inject:in": 2})
    assert store.read_through("Noop") == {"inject:in": 2}  # the computation has read both batches
    (spec,) = t.sinks.values()
    sink = KafkaSink(t.name, spec, url)  # never started: it has read no ledger, written nothing
    runner.sinks = [sink]
    now = store.now()
    store.clock = lambda: now + 60_000  # both batches a minute old, past the replay window of 0
    try:
        runner.trim()
        assert [r.id for _, r in store.read_segments("in", "inject:in", 0, 2)] == ["inject:in:1:0", "inject:in:2:0"]
        sink.writer.positions = {"inject:in": 2}  # as its ledger says once it has started and written both
        sink.opened.set()
        runner.trim()
        assert store.read_through("sink:in-kafka") == {"inject:in": 2}
        assert list(store.read_segments("in", "inject:in", 0, 1)) == []  # forgotten, now that every reader has it
    finally:
        sink.writer.close()
        sink.waiter.close()
        store.close()
