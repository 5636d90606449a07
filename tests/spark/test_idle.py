"""An idle continuous pipeline costs its store little (docs/architecture.md §4.2, "Wake-ups"): on
PostgreSQL a worker sleeps until a producer it reads commits (LISTEN/NOTIFY), and while nothing
happens it only renews its leases, looks for free intervals and asks whether to stop, each once
a second. The server counts: every statement of the idle spell is in its log
(``log_statement = 'all'``), each with the application name of the connection that sent it.

CI idles 10 s; ``scripts/test --long`` idles 30 s. The first record after the spell is still
delivered (its latency is bench/idle.py's to measure)."""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Iterator

import psycopg
import pytest

from headrace import Computation, Topology, injectors, key_by, read
from headrace.spark.continuous import ContinuousRunner

WORKERS = 2
MAX_PER_SECOND = 5


class Gate:
    """Values for an injector: ``first``, then nothing until ``release()``, then ``last``."""

    def __init__(self, first: list[Any], last: list[Any]):
        self.first, self.last, self.opened = first, last, threading.Event()

    def __call__(self) -> Iterator[Any]:
        yield from self.first
        self.opened.wait()
        yield from self.last


class Count(Computation):
    output = "counts"

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce(self.output, {"user": ctx.key, "n": ctx.state})


class Recount(Count):
    output = "recounts"


def statements(log: str, since: int, application: str) -> int:
    """The statements ``application``'s connections ran, logged after byte ``since`` of the log."""
    with open(log, errors="replace") as f:
        f.seek(since)
        return sum(1 for line in f if f" {application} LOG:  " in line and re.search(r"LOG:  (statement|execute)", line))


@pytest.mark.parametrize("idle_s", [pytest.param(10, id="10s"), pytest.param(30, id="30s", marks=pytest.mark.slow)])
def test_an_idle_pipeline_costs_each_worker_at_most_5_statements_a_second(spark: Any, postgres_server: Any,
                                                                          idle_s: int) -> None:
    url = postgres_server.new_database()
    with psycopg.connect(postgres_server.admin_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {url.rsplit('/', 1)[1]} SET log_statement = 'all'")
    first = [{"user": f"u{i % 5}", "ts": 1_000 + i} for i in range(50)]
    gate = Gate(first, [{"user": "late", "ts": 2_000}])
    t = Topology("idle")
    t.inject("events", injectors.records(gate, timestamp="ts", batch_size=25))
    t.add(Count, inputs={"events": key_by("user")}, outputs=["counts"], shards=4)
    t.add(Recount, inputs={"counts": key_by("user")}, outputs=["recounts"], shards=4)
    runner = ContinuousRunner(t, url, spark=spark, workers=WORKERS, progress=None).start()
    try:
        deadline = time.time() + 120
        while len(list(read("recounts", url))) < len(first):  # the first records went through both stages
            runner.check()
            assert time.time() < deadline, "the first records never reached the second stage"
            time.sleep(0.2)
        time.sleep(2)  # the last commits' wake-ups and reports settle: the spell starts idle
        log = str(postgres_server.log)
        mark = os.path.getsize(log)
        time.sleep(idle_s)
        spent = statements(log, mark, "headrace-worker")
        gate.opened.set()
        while not any(r.value["user"] == "late" for r in read("recounts", url)):
            runner.check()
            assert time.time() < deadline + idle_s, "the record after the idle spell never arrived"
            time.sleep(0.05)
    finally:
        runner.stop()
    per_second = spent / idle_s / WORKERS
    assert spent > 0, "no worker statement was logged: is log_statement on?"
    assert per_second <= MAX_PER_SECOND, f"{spent} statements in {idle_s} s from {WORKERS} workers"
