"""The pipeline the Kafka chaos test kills: a Kafka topic (several partitions, more added while it
runs) -> two keyed stages -> the sinks named on the command line (the test names a Kafka sink and
a Delta sink). Add a sink by adding an entry to
``SINKS`` (how to declare it) and one to ``test_kafka_chaos.READERS`` (how to read it back).

As a script it is one driver life, running until killed:
``python kafka_topology.py STORE_URL MODE BOOTSTRAP INPUT_TOPIC SINK=ARG [SINK=ARG ...]``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from headrace import Computation, Topology, injectors, key_by

USERS = [f"user-{i}" for i in range(12)]


class Tag(Computation):
    """First keyed stage (by user): counts the user's records in its state and stamps each with it."""

    def process_record(self, ctx: Any, record: Any) -> None:
        seen = (ctx.state or 0) + 1
        ctx.state = seen
        ctx.produce("tagged", {**record.value, "seen": seen})


class Bucket(Computation):
    """Second keyed stage (by n % 7): passes each record on with its bucket."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("out", {**record.value, "bucket": ctx.key})


SINKS: dict[str, Callable[[Topology, str, str], Any]] = {
    "kafka": lambda t, bootstrap, topic: t.sink("out", name="kafka-out", kafka=topic, bootstrap_servers=bootstrap,
                                                lease_ms=1_000),
    "delta": lambda t, bootstrap, path: t.sink("out", name="delta-out", delta=path),
}


def build(bootstrap: str, topic: str, sinks: list[str]) -> Topology:
    t = Topology("kafkachaos")
    t.inject("events", injectors.kafka(topic, bootstrap, parts=2, timestamp="ts", discover_ms=500, idle_ms=500,
                                       batch_size=200))
    t.add(Tag, inputs={"events": key_by("user")}, outputs=["tagged"], shards=3)
    t.add(Bucket, inputs={"tagged": key_by(lambda v: str(v["n"] % 7))}, outputs=["out"], shards=2)
    for entry in sinks:
        kind, _, arg = entry.partition("=")
        SINKS[kind](t, bootstrap, arg)
    return t


if __name__ == "__main__":
    from headrace import run

    store, mode, bootstrap, topic = sys.argv[1:5]
    run(build(bootstrap, topic, sys.argv[5:]), store=store, master="local[2,100]", progress=None, mode=mode)
