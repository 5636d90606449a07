from __future__ import annotations

import threading
import time
from typing import Any, Iterator

from headrace import Computation, Topology, injectors, key_by, read, run, watermarks
from headrace.spark.continuous import JOB_GROUP
from headrace.store import open_store

from .conftest import start_runner
from .pipelines import BASE, BucketTotals, WindowCounter, oracle, searches


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce(f"seen_{ctx.key}", record.value)


def wait_for_watermark(store_url: str, computations: list[str], at_least: int, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        marks = watermarks(store_url)
        if all(c in marks and marks[c].input_watermark >= at_least for c in computations):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{computations} never reached watermark {at_least}")


def test_late_records_are_counted_and_handled_by_each_computations_policy(spark: Any, store_url: str,
                                                                          mode: str) -> None:
    def events() -> Iterator[dict[str, Any]]:
        for i in range(20):
            yield {"k": "x", "ts": BASE + i * 100, "n": i}
        wait_for_watermark(store_url, ["Dropper", "Deliverer"], BASE + 1_000)
        for i in range(5):
            yield {"k": "x", "ts": BASE + i, "n": 100 + i}  # far behind the watermark: late on purpose
        for i in range(20, 30):
            yield {"k": "x", "ts": BASE + i * 100, "n": i}

    t = Topology("late")
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=5, max_delay_ms=0))
    t.add(Echo, name="Dropper", inputs={"events": key_by(lambda v: "drop")}, outputs=["seen_drop"], late="drop")
    t.add(Echo, name="Deliverer", inputs={"events": key_by(lambda v: "deliver")}, outputs=["seen_deliver"],
          late="deliver")
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode,
        **({"trigger_ms": 100} if mode == "microbatch" else {}))

    store = open_store(store_url)
    assert store.counters("Dropper").get("late_dropped") == 5
    assert store.counters("Deliverer").get("late_delivered") == 5
    dropped = sorted(r.value["n"] for r in read("seen_drop", store_url))
    delivered = sorted(r.value["n"] for r in read("seen_deliver", store_url))
    assert dropped == list(range(30))
    assert delivered == sorted([*range(30), *range(100, 105)])


def test_watermark_timers_fire_after_every_earlier_record(spark: Any, store_url: str, mode: str) -> None:
    events = searches(1_500, seed=11, disorder_ms=5_000)
    t = Topology("timers")
    t.inject("searches", injectors.records(events, timestamp="ts", batch_size=50))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    produced = list(read("window_counts", store_url))
    # a timer that fired before some record of its bucket arrived would emit a short count (and then
    # fail on a second firing); every count is complete and every window emitted exactly once
    assert sorted(((r.value["query"], r.value["bucket"]), r.value["count"]) for r in produced) == \
        sorted(oracle(events)["window_counts"].items())


def test_a_computation_added_while_running_catches_up_from_the_beginning(spark: Any, store_url: str,
                                                                         mode: str) -> None:
    events = searches(1_500, seed=21)
    grown = threading.Event()

    def source() -> Iterator[dict[str, Any]]:
        yield from events[:750]
        if not grown.wait(timeout=120):  # the rest is published once BucketTotals has been added
            raise TimeoutError("BucketTotals was never added")
        yield from events[750:]

    t = Topology("growing")  # a generator's watermark trails its highest timestamp by max_delay_ms: the disorder
    t.inject("searches", injectors.records(source, timestamp="ts", batch_size=50, max_delay_ms=3_000))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    runner = start_runner(t, store_url, spark, mode)
    try:
        deadline = time.time() + 120
        while runner.batches("WindowCounter") < 1:
            runner.check()
            assert time.time() < deadline, "WindowCounter never committed"
            time.sleep(0.05)
        t.add(BucketTotals, inputs={"window_counts": key_by(lambda v: str(v["bucket"]))}, outputs=["bucket_totals"])
        runner.add("BucketTotals")
        grown.set()
        runner.wait(timeout_s=300)
        assert runner.running("WindowCounter") and runner.running("BucketTotals")
    finally:
        grown.set()
        runner.stop()
    totals = {r.value["bucket"]: {"searches": r.value["searches"], "queries": r.value["queries"]}
              for r in read("bucket_totals", store_url)}
    assert totals == oracle(events)["bucket_totals"]
    assert sorted((r.value["query"], r.value["bucket"], r.value["count"]) for r in read("window_counts", store_url)) \
        == sorted((q, b, n) for (q, b), n in oracle(events)["window_counts"].items())


def test_a_computation_added_from_now_sees_exactly_what_is_published_after_it_started(
        spark: Any, store_url: str, mode: str) -> None:
    events = [{**e, "n": n} for n, e in enumerate(searches(2_000, seed=22))]
    held_back = 1_000  # a multiple of the batch size: everything before it is published, then nothing
    started = threading.Event()

    def source() -> Iterator[dict[str, Any]]:
        yield from events[:held_back]
        if not started.wait(timeout=120):  # the injector publishes nothing more until FromNow has started
            raise TimeoutError("FromNow never started")
        yield from events[held_back:]

    t = Topology("from_now")
    t.inject("searches", injectors.records(source, timestamp="ts", batch_size=50))
    t.add(Echo, name="FromStart", inputs={"searches": key_by(lambda v: "start")}, outputs=["seen_start"],
          late="deliver")
    runner = start_runner(t, store_url, spark, mode)
    try:
        store = open_store(store_url)
        deadline = time.time() + 120
        while len(store.batches("inject:searches")) < held_back // 50:
            runner.check()
            assert time.time() < deadline, "the first events were never published"
            time.sleep(0.05)
        t.add(Echo, name="FromNow", inputs={"searches": key_by(lambda v: "now")}, outputs=["seen_now"], late="deliver")
        jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP))
        runner.add("FromNow", start="now")  # returns once FromNow has taken its starting point
        started.set()
        runner.wait(timeout_s=300)
        runner.remove("FromNow")  # removing one computation leaves the others running
        assert runner.running("FromStart") and not runner.running("FromNow")
        if mode == "continuous":  # each change ends the workers' job and submits one new job, no more
            assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(JOB_GROUP)) - jobs_before <= 2
    finally:
        started.set()
        runner.stop()
    assert sorted(r.value["n"] for r in read("seen_start", store_url)) == list(range(len(events)))
    assert sorted(r.value["n"] for r in read("seen_now", store_url)) == list(range(held_back, len(events)))
