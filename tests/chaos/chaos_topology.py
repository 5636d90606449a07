"""The pipeline the chaos suite kills: an injector and three computations, one of them
non-deterministic (random numbers and the wall clock); with ``monoids``, four more: monoid
computations (their records folded before the shard, their state merged as delta rows,
docs/architecture.md §3.13), two with hooks of their own reading "tagged", and two built from
``headrace.monoids`` reading "events", then a typed stream, folded from its field columns.

As a script it is one driver life:
``python chaos_topology.py STORE_URL CHECKPOINTS PRODUCTIONS N [MODE [monoids]]`` (MODE: microbatch or
continuous).
"""

from __future__ import annotations

import operator
import random
import sys
import time
from pathlib import Path
from typing import Any

from headrace import Computation, Topology, injectors, key_by
from headrace.monoids import constant, field, tumbling

sys.path.insert(0, str(Path(__file__).parents[2]))  # run as a script: the repository root, for tests.monoids
from tests.monoids import Adding  # noqa: E402

BASE = 1_700_000_000_000
USERS = [f"user-{i}" for i in range(12)]
EVENT_SCHEMA = "user STRING, n BIGINT, ts BIGINT"


def events(n: int) -> list[dict[str, Any]]:
    rng = random.Random(99)
    out = [{"user": rng.choice(USERS), "n": i, "ts": BASE + i * 7 + rng.randrange(50)} for i in range(n)]
    out.sort(key=lambda e: e["ts"] + rng.randrange(200))
    return out


class Tagger(Computation):
    """Non-deterministic: tags each record with a random number and the wall clock; remembers them."""

    def draw(self) -> float:
        return random.random()

    def process_record(self, ctx: Any, record: Any) -> None:
        tag = self.draw()
        ctx.state = {**(ctx.state or {}), record.value["n"]: tag}
        ctx.produce("tagged", {**record.value, "tag": tag, "at": time.time()})


class Collector(Computation):
    """Keyed differently (by n's parity and user): collects what Tagger sent; reports at the end."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = {**(ctx.state or {}), record.value["n"]: record.value["tag"]}
        ctx.set_timer("end", 2**62)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("collected", {"group": ctx.key, "tags": ctx.state})


class Windows(Computation):
    """Per 100 ms bucket of event time: how many records, emitted by a watermark timer."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("close", int(ctx.key) + 100)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("windows", {"bucket": int(ctx.key), "count": ctx.state})
        ctx.state = None


class UserCount(Adding):
    """A monoid keyed count: records per user, emitted once the input has ended."""

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("user_counts", {"user": ctx.key, "count": aggregate})


class UserSums(UserCount):
    """A monoid windowed sum: n per user and 100 ms bucket, emitted when the watermark closes it."""

    def lift(self, record: Any) -> int:
        return int(record.value["n"])

    def window(self, record: Any) -> int:
        return record.timestamp - record.timestamp % 100 + 100

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("user_sums", {"user": ctx.key, "bucket": timer.timestamp - 100, "sum": aggregate})


class EventCount(UserCount):
    """The keyed count from ready-made hooks: folded from the typed events' columns."""

    lift = constant(1)
    combine = operator.add

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("event_counts", {"user": ctx.key, "count": aggregate})


class EventSums(EventCount):
    """The windowed sum from ready-made hooks: n per user and 100 ms bucket."""

    lift = field("n")
    window = tumbling(100)

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("event_sums", {"user": ctx.key, "bucket": timer.timestamp - 100, "sum": aggregate})


def build(n: int, productions: str = "strong", rate: float = 400, monoids: bool = False,
          tagger: type[Tagger] = Tagger) -> Topology:
    t = Topology("chaos")
    t.inject("events", injectors.records(events(n), timestamp="ts", batch_size=40, rate=rate))
    t.add(tagger, "Tagger", inputs={"events": key_by("user")}, outputs=["tagged"], productions=productions, shards=3)
    t.add(Collector, inputs={"tagged": key_by(lambda v: f"{v['user']}/{v['n'] % 2}")}, outputs=["collected"], shards=2)
    t.add(Windows, inputs={"tagged": key_by(lambda v: str(v["ts"] - v["ts"] % 100))}, outputs=["windows"], shards=2)
    if monoids:
        t.add(UserCount, inputs={"tagged": key_by("user")}, outputs=["user_counts"], shards=2)
        t.add(UserSums, inputs={"tagged": key_by("user")}, outputs=["user_sums"], shards=2)
        t.stream("events", schema=EVENT_SCHEMA)
        t.add(EventCount, inputs={"events": key_by("user")}, outputs=["event_counts"], shards=2)
        t.add(EventSums, inputs={"events": key_by("user")}, outputs=["event_sums"], shards=2)
    return t


def churn(runner: Any, plan: str, every_s: float, stop: Any) -> None:
    """Rescale computations of a running topology, one after another, as live rebalancing does:
    ``plan`` is ``Name:n,m;Other:k,...`` (each computation's counts, taken in turn, round and round)."""
    steps = [(name, int(n)) for part in plan.split(";") for name, counts in [part.split(":")]
             for n in counts.split(",")]
    i = 0
    while not stop.wait(every_s):
        name, shards = steps[i % len(steps)]
        runner.rescale(name, shards)
        i += 1


if __name__ == "__main__":
    import os
    import threading

    from headrace import run
    from headrace.spark.continuous import ContinuousRunner

    store, checkpoints, productions, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "microbatch"
    monoids = sys.argv[6:] == ["monoids"]
    rescales = os.environ.get("HEADRACE_TEST_RESCALES")
    if mode == "continuous" and rescales:  # splits and merges while it runs, as the rebalancer makes them
        runner = ContinuousRunner(build(n, productions, monoids=monoids), store, "local[2,100]", progress=None,
                                  rebalance=False).start()
        stop = threading.Event()
        threading.Thread(target=churn, args=(runner, rescales, 4.0, stop), daemon=True).start()
        try:
            runner.wait()
        finally:
            stop.set()
            runner.stop()
    elif mode == "continuous":  # local[2,100]: Spark retries a killed worker's task, as on a cluster
        run(build(n, productions, monoids=monoids), store=store, master="local[2,100]", progress=None, mode=mode)
    else:
        run(build(n, productions, monoids=monoids), store=store, master="local[2,100]", checkpoint_dir=checkpoints,
            progress=None,
            trigger_ms=100, mode="microbatch")
    print("drained", flush=True)
