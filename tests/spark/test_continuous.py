"""Continuous mode on a real local[2] Spark session (docs/architecture.md §4.2): the workers are
the tasks of one background Spark job, and a worker paused past its lease loses its intervals to
the other, has its writes refused once it resumes, and nothing is lost or duplicated."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pytest

from headrace import Computation, Topology, injectors, key_by, read
from headrace.monitor.events import fenced_events
from headrace.names import interval as interval_producer, meta
from headrace.model import END_OF_TIME
from headrace.spark.continuous import JOB_GROUP, ContinuousRunner
from headrace.store import Store, open_store

from ..ci import long_only
from .pipelines import BASE, oracle, searches, three_stage

T = TypeVar("T")


def poll(condition: Callable[[], T], what: str, timeout_s: float = 30.0, runner: ContinuousRunner | None = None) -> T:
    """``condition()`` once it is truthy; fails after ``timeout_s`` (and at once if the runner failed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if runner is not None:
            runner.check()
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s} s for {what}")
        time.sleep(0.02)


def worker_rows(store: Store, topology: str, run_id: str) -> dict[str, dict[str, Any]]:
    """The meta rows the run's worker tasks wrote, by owner."""
    prefix = meta.worker(topology, run_id)
    return {name[len(prefix):]: json.loads(value) for name, value in store.metas(prefix).items()}


def fenced_rows(store: Store, run_id: str) -> list[tuple[str, str, str]]:
    """(owner, "C/i", error text) of every commit the run's workers had fenced."""
    return [(e["owner"], e["interval"], e["message"]) for e in fenced_events(store) if e["run"] == run_id]


def owners(store: Store, computation: str) -> dict[int, str | None]:
    return {shard: owner for shard, (owner, _, _) in store.interval_owners(computation).items()}


@pytest.fixture
def opened() -> Iterator[Callable[[str], Store]]:
    """Opens store clients for the test's own checks, and closes them after it."""
    stores: list[Store] = []

    def open_(url: str) -> Store:
        stores.append(open_store(url))
        return stores[-1]
    yield open_
    for store in stores:
        store.close()


# -- 1. the workers are Spark tasks ------------------------------------------------------------------

class CountPerKey(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def endless(i: int) -> dict[str, Any]:
    return {"key": f"k{i % 17}", "ts": BASE + 10 * i}


def test_continuous_workers_are_the_tasks_of_one_running_spark_job(spark: Any, store_url: str,
                                                                  opened: Callable[[str], Store]) -> None:
    topology = Topology("tasks")
    topology.inject("events", injectors.generator(endless, count=None, timestamp="ts", rate=200, batch_size=20))
    topology.add(CountPerKey, inputs={"events": key_by("key")}, outputs=[], shards=4)
    tracker = spark.sparkContext.statusTracker()
    earlier_jobs = set(tracker.getJobIdsForGroup(JOB_GROUP))
    store = opened(store_url)
    # without progress queries (and sinks), every task slot is a worker's; with them, one is left to them
    runner = ContinuousRunner(topology, store_url, spark=spark, progress=None, progress_queries=False).start()
    try:
        slots = runner.slots()
        assert slots == spark.sparkContext.defaultParallelism == 2
        rows = poll(lambda: (r := worker_rows(store, runner.topology.name, runner.run_id)) and len(r) >= slots and r,
                    f"{slots} worker meta rows", runner=runner)
        assert len(rows) == slots, f"one worker per slot, no retried task: {rows}"
        assert sorted(r["partition"] for r in rows.values()) == list(range(slots))
        assert sorted(r["slot"] for r in rows.values()) == list(range(slots))
        assert {r["attempt"] for r in rows.values()} == {0}
        stages = {r["stage"] for r in rows.values()}
        assert len(stages) == 1 and isinstance(next(iter(stages)), int), f"one stage for every worker: {rows}"
        stage = stages.pop()
        pids = {r["pid"] for r in rows.values()}
        assert len(pids) == slots and os.getpid() not in pids, "each worker is its own Spark Python worker process"

        jobs = set(tracker.getJobIdsForGroup(JOB_GROUP)) - earlier_jobs
        assert len(jobs) == 1, f"one background job in {JOB_GROUP!r}: {jobs}"
        job = jobs.pop()
        info = tracker.getJobInfo(job)
        assert info.status == "RUNNING" and stage in info.stageIds, info
        assert tracker.getStageInfo(stage).numTasks == slots
        # the status tracker follows Spark's listener bus, a little behind the tasks themselves
        poll(lambda: tracker.getStageInfo(stage).numActiveTasks == slots, f"{slots} active tasks in stage {stage}")

        # the workers own every interval, and process the input
        poll(lambda: set(owners(store, "CountPerKey").values()) == set(rows), "both workers to own intervals",
             runner=runner)
        poll(lambda: sum(store.latest_batches([interval_producer("CountPerKey", i) for i in range(4)]).values()) >= 8,
             "interval commits", runner=runner)
    finally:
        runner.stop()
    status = poll(lambda: (s := tracker.getJobInfo(job).status) != "RUNNING" and s, "the job to end", timeout_s=20)
    assert status == "SUCCEEDED", "the workers returned when told to stop (the job was not cancelled)"
    assert set(tracker.getJobIdsForGroup(JOB_GROUP)) - earlier_jobs == {job}, "no job was resubmitted"
    assert all(owner is None and lease == 0 for owner, lease, _ in store.interval_owners("CountPerKey").values()), (
        "the workers released their intervals")


def test_run_takes_the_number_of_workers_and_runs_that_many_tasks(spark: Any, store_url: str,
                                                                opened: Callable[[str], Store]) -> None:
    """``run(..., workers=1)`` on a session of two slots: one worker task owns all four intervals."""
    from headrace import run

    topology = Topology("one_worker")
    topology.inject("events", injectors.generator(endless, count=400, timestamp="ts", rate=2_000, batch_size=20))
    topology.add(CountPerKey, inputs={"events": key_by("key")}, outputs=[], shards=4)
    tracker = spark.sparkContext.statusTracker()
    earlier_jobs = set(tracker.getJobIdsForGroup(JOB_GROUP))
    run(topology, store=store_url, spark=spark, progress=None, mode="continuous", workers=1)
    jobs = set(tracker.getJobIdsForGroup(JOB_GROUP)) - earlier_jobs
    assert len(jobs) == 1, f"one background job in {JOB_GROUP!r}: {jobs}"
    stages = tracker.getJobInfo(jobs.pop()).stageIds
    assert [tracker.getStageInfo(s).numTasks for s in stages] == [1], "one worker task, though two slots were free"
    store = opened(store_url)
    codec = topology.computations["CountPerKey"].options.codec
    counts = {f"k{k}": codec.decode(store.state("CountPerKey", f"k{k}")) for k in range(17)}
    assert counts == dict(Counter(endless(i)["key"] for i in range(400)))


def test_more_workers_than_free_task_slots_are_refused_before_anything_starts(spark: Any, store_url: str,
                                                                              opened: Callable[[str], Store]) -> None:
    from headrace import run
    from headrace.errors import OptionError

    topology = Topology("too_many_workers")
    topology.inject("events", injectors.generator(endless, count=40, timestamp="ts", batch_size=20))
    topology.add(CountPerKey, inputs={"events": key_by("key")}, outputs=[], shards=4)
    with pytest.raises(OptionError, match=r"workers=3 is more than the 2 task slots this run leaves free \(got 3\)\. "
                                          r"Hint: the session has 2 task slots, and a worker holds its slot for the "
                                          r"whole run: ask for at most 2 workers, or give Spark more cores"):
        run(topology, store=store_url, spark=spark, progress=None, mode="continuous", workers=3)
    assert opened(store_url).batches("inject:events") == [], "the injector started"


# -- 2. a worker paused past its lease --------------------------------------------------------------

STAGES = ("WindowCounter", "BucketTotals", "BusiestBucketPerTenSeconds")
LEASE_MS = 1_500
FAILPOINT_MS = 20


@contextmanager
def worker_environment(spark: Any, **env: str) -> Iterator[None]:
    """Environment variables for the Python workers of the jobs submitted meanwhile. PySpark sends
    ``SparkContext.environment`` with every Python function, and Spark keeps one worker daemon per
    distinct environment, so these workers are fresh processes that see ``env``."""
    environment = spark.sparkContext.environment
    saved = {k: environment.get(k) for k in env}
    environment.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                environment.pop(k, None)
            else:
                environment[k] = v


def is_stopped(pid: int) -> bool:
    """The process is stopped by a signal (state T in /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


def pause_before_a_commit(pid: int, marks: Path, timeout_s: float = 30.0) -> None:
    """SIGSTOP ``pid`` while it sleeps in the ``begin`` failpoint of a commit: provably outside any
    store transaction (SQLite's one write lock, or PostgreSQL's row locks on the shard and the
    counters, would otherwise stall every other worker for as long as it is paused), and provably
    about to commit once it resumes. The failpoint's marker file exists only while the process
    sleeps there; a process stopped just after it left is resumed, and the pause is tried again."""
    mark = marks / str(pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not mark.exists():
            time.sleep(0.001)
            continue
        os.kill(pid, signal.SIGSTOP)
        poll(lambda: is_stopped(pid), f"process {pid} to stop", timeout_s=5)
        if mark.exists():
            return
        os.kill(pid, signal.SIGCONT)
    pytest.fail(f"worker {pid} did not reach a commit in {timeout_s} s")


def test_a_worker_paused_past_its_lease_loses_its_intervals_and_its_writes_are_refused(
        spark: Any, each_store: str, tmp_path: Path, opened: Callable[[str], Store]) -> None:
    if "sqlite" in each_store:
        long_only("SQLite", covered_by="PostgreSQL, the store a cluster uses")
    events = searches(3_000, seed=11)
    topology = three_stage(events, batch_size=100, name="paused", rate=200)  # about 15 s of input
    marks = tmp_path / "marks"
    marks.mkdir()
    store = opened(each_store)
    paused: int | None = None
    with worker_environment(spark, HEADRACE_FAILPOINTS=f"begin=sleep:{FAILPOINT_MS}:{marks}"):
        # rebalance=False: a move fences its interval's holder too (tests/spark/test_rebalancing.py)
        runner = ContinuousRunner(topology, each_store, spark=spark, progress=None, lease_ms=LEASE_MS,
                                  progress_queries=False, rebalance=False).start()  # both slots for workers
        try:
            rows = poll(lambda: (r := worker_rows(store, runner.topology.name, runner.run_id)) and len(r) == 2 and r, "2 workers",
                        runner=runner)
            poll(lambda: {o for c in STAGES for o in owners(store, c).values()} == set(rows),
                 "both workers to own intervals", runner=runner)
            # mid-stream: the intervals have committed state and input positions the new owner must resume
            # from (an interval with nothing of its own commits nothing: it is reported quiet instead)
            poll(lambda: all(max(store.shard_versions(c).values()) >= 3 for c in STAGES),
                 "each stage to commit three batches", runner=runner)
            # whichever worker is next about to commit is paused there. Pausing it anywhere else would
            # not make it try a write once resumed: idle, it renews first, finds its leases gone and
            # drops its intervals without a commit (tests/unit/engine/test_worker.py covers that path)
            pids = {r["pid"]: owner for owner, r in rows.items()}
            pid = poll(lambda: next((p for p in pids if (marks / str(p)).exists()), None), "a commit", runner=runner)
            pause_before_a_commit(pid, marks)
            paused, victim = pid, pids[pid]
            (survivor,) = set(rows) - {victim}
            held = {c: {i: seq for i, (o, _, seq) in store.interval_owners(c).items() if o == victim} for c in STAGES}
            assert any(held.values()), f"the paused worker owns no interval: {held}"
            assert not all(i.finished.is_set() for i in runner.injectors.values()), "paused before the input ended"

            # its leases lapse; the other worker takes every one of its intervals, under new sequencers
            def taken() -> bool:
                now = {c: store.interval_owners(c) for c in STAGES}
                return all(now[c][i][0] == survivor and now[c][i][2] > seq for c in STAGES for i, seq in held[c].items())
            poll(taken, "the survivor to take the paused worker's intervals", runner=runner)
            assert is_stopped(pid) and (marks / str(pid)).exists(), "still paused before its commit"

            os.kill(pid, signal.SIGCONT)
            paused = None
            runner.wait(timeout_s=90)
            after = {c: owners(store, c) for c in STAGES}
            fenced = fenced_rows(store, runner.run_id)
            # only the resumed worker is ever fenced: a fenced survivor means a zombie's write got through
            assert {o for o, _, _ in fenced} <= {victim}, fenced
            # it resumed inside a commit of an interval it lost: that commit must have been refused
            poll(lambda: any(o == victim for o, _, _ in fenced_rows(store, runner.run_id)),
                 "the resumed worker's commit to be fenced", timeout_s=10)
        finally:
            if paused is not None:
                os.kill(paused, signal.SIGCONT)
            runner.stop()

    # the resumed worker noticed: it owns nothing (the survivor never let a lease lapse)
    assert all(o == survivor for c in STAGES for o in after[c].values()), after
    # only the resumed worker was ever fenced, and only on intervals it held when paused, each once,
    # by the sequencer check (a zombie's commit must never reach the version check, nor succeed)
    fenced = fenced_rows(store, runner.run_id)
    assert {o for o, _, _ in fenced} == {victim}, fenced
    intervals = Counter(interval for _, interval, _ in fenced)
    assert set(intervals.values()) == {1}, f"an interval was fenced twice: {fenced}"
    for _, interval, text in fenced:
        computation, _, shard = interval.partition("/")
        assert int(shard) in held[computation], f"{interval} was not the paused worker's: {held}"
        assert f"with sequencer {held[computation][int(shard)]} was fenced off" in text, text

    # every interval's journal is its batches 1..n, once each, and it reached the end of time (in its
    # last commit, or reported quiet since)
    for c in STAGES:
        versions = store.shard_versions(c)
        for shard, version in versions.items():
            journal = store.batches(interval_producer(c, shard))
            assert [b.batch for b in journal] == list(range(1, version + 1)), (c, shard, version)
            head = store.producer_heads([interval_producer(c, shard)])[interval_producer(c, shard)]
            assert head.output_watermark == END_OF_TIME, (c, shard, head)
        assert all(o is None for o, _, _ in store.interval_owners(c).values()), "released at stop"

    expected = oracle(events)
    window = [(r.value["query"], r.value["bucket"], r.value["count"]) for r in read("window_counts", each_store)]
    totals = [(r.value["bucket"], r.value["searches"], r.value["queries"]) for r in read("bucket_totals", each_store)]
    busiest = [(r.value["span"], r.value["bucket"], r.value["searches"]) for r in read("busiest", each_store)]
    assert sorted(window) == sorted((q, b, c) for (q, b), c in expected["window_counts"].items())
    assert sorted(totals) == sorted((b, t["searches"], t["queries"]) for b, t in expected["bucket_totals"].items())
    assert sorted(busiest) == sorted((s, b["bucket"], b["searches"]) for s, b in expected["busiest"].items())
    # each record was processed once: none twice (nor dropped as late when read again)
    processed = {c: store.counters(c) for c in STAGES}
    assert [processed[c].get("records") for c in STAGES] == [len(events), len(window), len(totals)], processed
    assert all(processed[c].get("late_dropped", 0) == 0 for c in STAGES), processed
