"""Wall timers on Spark, in each mode (docs/architecture.md §2.5): a timer set by a record fires
once the wall clock reaches it while no input arrives (micro-batch: the source's wall-clock offset,
§3.9; continuous, on PostgreSQL: an idle worker, asleep until notified, wakes at its intervals'
next wall timer, §4.2), once per key and never before its time."""

from __future__ import annotations

from typing import Any

from headrace import Computation, Topology, injectors, key_by, read
from headrace.spark.continuous import ContinuousRunner
from headrace.store import open_store

from .conftest import start_runner
from .pipelines import BASE
from .test_idle import Gate
from .test_query_restarts import wait_for

DELAY_MS = 1_500


class Reminder(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = {"ts": record.timestamp, "set_at": ctx.wall_clock}
        ctx.set_timer("remind", ctx.wall_clock + DELAY_MS, domain="wall")

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("reminders", {"key": ctx.key, "set_at": ctx.state["set_at"], "due": timer.timestamp,
                                  "fired_at": ctx.wall_clock, "tag": timer.tag, "domain": timer.domain},
                    timestamp=ctx.state["ts"])


def test_a_wall_timer_fires_once_when_its_time_comes_with_no_input_arriving(spark: Any, store_url: str, mode: str,
                                                                            request: Any) -> None:
    if mode == "continuous":  # an idle worker sleeps until notified there: only its wall timer can wake it
        store_url = request.getfixturevalue("postgres_server").new_database()
    keys = ["a", "b", "c"]
    gate = Gate([{"key": k, "ts": BASE + i} for i, k in enumerate(keys)], [])
    t = Topology(f"wall-timers-{mode}")
    t.inject("events", injectors.records(gate, timestamp="ts", batch_size=3))
    t.add(Reminder, inputs={"events": key_by("key")}, outputs=["reminders"], shards=2)
    if mode == "continuous":  # leases renewed every 10 s: a pass at a renewal cannot stand in for the wall timer's own
        runner: Any = ContinuousRunner(t, store_url, spark=spark, progress=None, lease_ms=60_000).start()
    else:
        runner = start_runner(t, store_url, spark, mode)
    try:
        # the gate holds the input back meanwhile
        wait_for(runner, "a wall timer to fire", lambda: len(list(read("reminders", store_url))) == len(keys))
        assert not gate.opened.is_set()
        gate.opened.set()  # the end of the input: each shard runs again, where a timer still kept would fire twice
        runner.wait(timeout_s=300)
    finally:
        gate.opened.set()
        runner.stop()
    fired = {r.value["key"]: r.value for r in read("reminders", store_url)}
    assert len(list(read("reminders", store_url))) == len(keys), "each timer fires once"
    assert sorted(fired) == keys
    for key, got in fired.items():
        assert (got["tag"], got["domain"], got["due"]) == ("remind", "wall", got["set_at"] + DELAY_MS), got
        assert got["fired_at"] >= got["due"], f"{key}'s timer fired {got['due'] - got['fired_at']} ms early"
        if mode == "continuous":  # woken for it, not by the next renewal 10 s on
            assert got["fired_at"] - got["due"] < 1_000, f"{key}'s timer fired {got['fired_at'] - got['due']} ms late"
    store = open_store(store_url)
    try:
        assert store.next_wall_timer("Reminder", None) is None  # none left pending
    finally:
        store.close()
