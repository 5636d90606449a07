"""Continuous mode (docs/architecture.md §4.2): long-lived headrace workers hosted by Spark.

    driver: injectors, the watermark authority, the background job (resubmitted if it ends)
      │ one normal, non-barrier Spark job: a task per worker slot, each a ``Worker`` loop
      ▼
    worker: leases on key intervals ─► new input for them ─► user code ─► one commit per interval

No Spark shuffle on the hot path: a worker reads its inputs from the bus, keys them itself and
keeps the records of the intervals it owns. A record is on the bus, and its consumer can see it,
from the moment its producer's transaction commits; consumers poll the journal every few ms.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Iterator, Mapping, Sequence, TextIO

from ..engine.worker import IntervalPlan, Worker, interval_producer
from ..errors import FencedWriterError, OptionError, UserCodeError
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..monitor.events import blamed, record_error
from ..monitor.graph import record_topology
from ..monitor.watch import Watcher, announce_metrics, check_metrics_port
from ..store import Store, open_store
from ..topology import Topology
from .frames import declare_schemas
from .inject import DataFrameInjector
from .progress import StatusQuery, check_progress_queries, flush_progress, start_progress, stop_progress
from .query import QueryStats, failure_detail
from .runner import (InjectorThread, RunResult, announce_ui, check_injectors,
                     checkpoint_root, claim_mode, start_injectors)
from .session import spark_session, ui_url
from .shipping import prepare_user_code
from .sinks import SinkQuery, jdbc_jars, start_sinks

__all__ = ["ContinuousRunner", "continuous_producers"]

JOB_GROUP = "headrace-continuous"


def continuous_producers(topology: Topology, stream: str) -> list[str]:
    """Who writes ``stream`` in continuous mode: the injector's parts, and every interval of
    every computation that outputs it."""
    names = list(topology.injections[stream].producers) if stream in topology.injections else []
    for spec in topology.computations.values():
        if stream in spec.outputs:
            names.extend(interval_producer(spec.name, i) for i in range(spec.options.shards))
    return names


def retired_producers(store: Store, topology: Topology) -> dict[str, tuple[str, ...]]:
    """Per stream: the intervals that wrote it under a computation's earlier, larger layout
    (``C/<i>`` with ``i`` past its shard count now); consumers still read them to their end."""
    out: dict[str, tuple[str, ...]] = {}
    for stream in topology.streams():
        current = set(continuous_producers(topology, stream))
        parts = {f"{spec.name}/" for spec in topology.computations.values() if stream in spec.outputs}
        out[stream] = tuple(p for p in store.stream_producers(stream)
                            if p not in current and p[:p.rfind("/") + 1] in parts and p[p.rfind("/") + 1:].isdigit())
    return out


def plans_of(topology: Topology, retired: Mapping[str, tuple[str, ...]] | None = None) -> list[IntervalPlan]:
    retired = retired or {}
    return [IntervalPlan(spec.name, spec.cls, spec.options, frozenset(spec.outputs), dict(spec.inputs),
                         {s: tuple(continuous_producers(topology, s)) + retired.get(s, ()) for s in spec.inputs},
                         topology.dedup_streams(spec.name), topology.checked_schemas(spec.name),
                         frozenset(p for s in spec.inputs for p in retired.get(s, ())))
            for spec in topology.computations.values()]


def _worker_task(url: str, plans: list[IntervalPlan], slots: int, run_id: str, driver: tuple[str, str],
                 lease_ms: int, poll_ms: float) -> Any:
    def task(index: int, _: Iterator[Any]) -> Iterator[str]:
        from pyspark import TaskContext

        context = TaskContext.get()
        owner = f"{socket.gethostname()}:{os.getpid()}:task{index}.{context.attemptNumber() if context else 0}"
        store = open_store(url)
        # no lock outlives a lease: cut off mid-commit, a worker's transaction is ended by the server
        store.limit_idle_transactions(lease_ms)
        store.put_meta(f"worker:{run_id}:{owner}", json.dumps({
            "slot": index, "pid": os.getpid(), "host": socket.gethostname(),
            "stage": context.stageId() if context else None, "partition": context.partitionId() if context else None,
            "attempt": context.attemptNumber() if context else None, "started_at": int(time.time() * 1000)}))
        stop_key = f"stop:{run_id}"
        checked = {"at": 0.0, "stop": False}
        parent = os.getppid()

        def should_stop() -> bool:
            now = time.monotonic()
            if now - checked["at"] > 0.25:
                # the driver asked, or the executor that started this process is gone (a worker loop
                # never talks to it, so it would not notice otherwise and would renew its leases forever)
                checked["at"] = now
                # or a newer driver of the topology took over
                checked["stop"] = (store.get_meta(stop_key) is not None or os.getppid() != parent
                                   or store.get_meta(driver[0]) != driver[1])
            return bool(checked["stop"])

        def fenced(computation: str, interval: int, exc: Exception) -> None:
            store.put_meta(f"fenced:{run_id}:{owner}:{computation}/{interval}:{int(time.time() * 1000)}",
                           str(exc))

        try:
            Worker(store, plans, owner, index, slots, lease_ms=lease_ms, poll_ms=poll_ms,
                   on_fenced=fenced).run(should_stop)
        finally:
            store.close()
        yield owner
    return task


class ContinuousRunner:
    """Runs a topology in continuous mode. ``start()``, then ``wait()`` (drained) or ``stop()``."""

    def __init__(self, topology: Topology, store: str, master: str = "local[*]", *, spark: Any = None,
                 progress: TextIO | None = None, progress_every_s: float = 5.0, lease_ms: int = 3_000,
                 poll_ms: float = 2.0, workers: int | None = None, authority_every_ms: int = 100,
                 metrics_port: int | None = None, ui: bool = True, py_files: Sequence[str] = (),
                 progress_queries: bool = False):
        self.topology = topology
        self.py_files = list(py_files)
        self.metrics_port = check_metrics_port(metrics_port)
        self.store = open_store(store)
        self.url = self.store.url
        self.master, self.spark, self.progress, self.progress_every_s = master, spark, progress, progress_every_s
        self.lease_ms, self.poll_ms, self.workers, self.authority_every_ms = lease_ms, poll_ms, workers, authority_every_ms
        self.run_id = uuid.uuid4().hex[:12]
        self.driver = (f"driver:{topology.name}", uuid.uuid4().hex[:12])  # (meta key, this driver's id)
        self.ui = ui
        self.with_progress = check_progress_queries(progress_queries)
        self.injectors: dict[str, InjectorThread | DataFrameInjector] = {}
        self.sinks: list[SinkQuery] = []
        self.progress_queries: dict[str, StatusQuery] = {}
        self.errors: list[BaseException] = []
        self.resubmissions = 0
        self.removed: set[str] = set()
        self._stopping = threading.Event()
        self.watcher: Watcher | None = None
        self._job: threading.Thread | None = None
        self._authority: threading.Thread | None = None
        self._marks: dict[str, tuple[int, int]] = {}
        self.retired: dict[str, tuple[str, ...]] = {}
        self._started = 0.0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "ContinuousRunner":
        self._started = time.time()
        if self.spark is None:
            self.spark = spark_session(self.master, app_name=f"headrace-{self.topology.name}",
                                       conf=jdbc_jars(self.topology), ui=self.ui)
        announce_ui(self.spark, self.progress)
        prepare_user_code(self.spark, self.topology, self.py_files, self.progress)
        claim_mode(self.store, self.topology.name, "continuous")
        self.store.put_meta(*self.driver)  # the newest driver of a topology is its only one; older ones stop
        for spec in self.topology.computations.values():
            self.store.register(spec.name, spec.options.shards)
        self.retired = retired_producers(self.store, self.topology)
        for stream in sorted(self.topology.streams()):
            self.store.declare_stream(stream, *continuous_producers(self.topology, stream))
        self._record_topology()
        declare_schemas(self.store, self.topology.schemas)
        self.watcher = Watcher(self.url, metrics_port=self.metrics_port).start()
        announce_metrics(self.watcher, self.progress)
        checkpoints = checkpoint_root(self.store, self.topology.name, None)
        self.injectors = start_injectors(self.topology, self.url, checkpoints, 200, self.errors.append)
        self.sinks = start_sinks(self.spark, self.topology, self.url, checkpoints, 200)
        if self.with_progress:
            self.progress_queries = start_progress(self.spark, list(self.topology.computations), self.url)
        self._job = threading.Thread(target=self._run_job, name="headrace-continuous-job", daemon=True)
        self._job.start()
        self._authority = threading.Thread(target=self._run_authority, name="headrace-watermark-authority",
                                           daemon=True)
        self._authority.start()
        return self

    def _run_authority(self) -> None:
        """The watermark authority: journals every computation's low watermarks several times a second."""
        store = open_store(self.url)
        try:
            while not self._stopping.wait(self.authority_every_ms / 1000):
                try:
                    self.refresh_watermarks(store)
                except Exception as exc:  # surfaced by wait(); the authority is not worth a silent death
                    self.errors.append(exc)
                    return
        finally:
            store.close()

    def add(self, name: str, start: str | int = "beginning") -> None:
        """Start computation ``name`` (already in the topology) on the running workers: they are
        asked to stop, and a new job takes every interval, the new computation's included, from
        where it was committed. ``start`` is ``"beginning"`` of its inputs, ``"now"``, or a time
        in ms since the epoch; it applies to a computation that has committed nothing yet."""
        if not (start in ("beginning", "now") or (isinstance(start, int) and not isinstance(start, bool))):
            raise OptionError("A computation starts from 'beginning', 'now' or a time in ms since the epoch",
                              got=start, hint="start='beginning'")
        spec = self.topology.computation(name)
        self.removed.discard(name)
        self.store.register(spec.name, spec.options.shards)
        self.retired = retired_producers(self.store, self.topology)
        for stream in spec.outputs:
            self.store.declare_stream(stream, *continuous_producers(self.topology, stream))
        if start != "beginning":
            producers = sorted({p for s in spec.inputs for p in continuous_producers(self.topology, s)})
            heads = self.store.latest_batches(producers) if start == "now" else {
                p: self.store.batch_before(p, int(start)) for p in producers}
            for shard in range(spec.options.shards):
                self.store.start_interval_at(name, shard, heads)
        self._record_topology()
        if self.with_progress and self._job is not None and name not in self.progress_queries:
            self.progress_queries.update(start_progress(self.spark, [name], self.url))
        self._restart_job()

    def _record_topology(self) -> None:
        bus = {s: continuous_producers(self.topology, s) for s in self.topology.streams()}
        record_topology(self.store, self.topology, "continuous", bus)

    def remove(self, name: str) -> None:
        """Stop computation ``name``; the others go on (their workers restart, from their commits)."""
        self.topology.computation(name)
        self.removed.add(name)
        progress = self.progress_queries.pop(name, None)
        if progress is not None:
            progress.stop()
        self._restart_job()

    def running(self, name: str) -> bool:
        return name in self.topology.computations and name not in self.removed and self._job is not None \
            and self._job.is_alive()

    def batches(self, name: str) -> int:
        """How many interval commits computation ``name`` has made."""
        return sum(self.store.latest_batches(self._parts(name)).values())

    def _parts(self, name: str) -> list[str]:
        """The bus producers of computation ``name``'s intervals."""
        return [interval_producer(name, i) for i in range(self.topology.computation(name).options.shards)]

    def _restart_job(self) -> None:
        if self._job is None:
            return
        old, self.run_id = self.run_id, uuid.uuid4().hex[:12]  # first: the old job's loop ends, not resubmits
        self.store.put_meta(f"stop:{old}", "1")
        self._job.join(timeout=30)
        self._job = threading.Thread(target=self._run_job, name="headrace-continuous-job", daemon=True)
        self._job.start()

    def slots(self) -> int:
        """Worker slots: the cluster's task slots less one per streaming-DataFrame injector and one
        that the sinks and the progress queries share (their queries need a slot to run; a
        progress batch is one short task), and at least one."""
        if self.workers is not None:
            return self.workers
        reserved = sum(isinstance(i, DataFrameInjector) for i in self.injectors.values()) + bool(
            self.sinks or self.progress_queries)
        return max(1, self.spark.sparkContext.defaultParallelism - reserved)

    def _run_job(self) -> None:
        sc = self.spark.sparkContext
        plans = [p for p in plans_of(self.topology, self.retired) if p.name not in self.removed]
        run_id = self.run_id
        failures: list[float] = []
        while not self._stopping.is_set() and run_id == self.run_id:
            slots = self.slots()
            names = ", ".join(p.name for p in plans)
            sc.setJobGroup(JOB_GROUP, f"headrace {self.topology.name}: {slots} continuous workers running {names}",
                           interruptOnCancel=True)
            task = _worker_task(self.url, plans, slots, run_id, self.driver, self.lease_ms, self.poll_ms)
            try:
                sc.parallelize(range(slots), slots).mapPartitionsWithIndex(task).collect()
            except Exception as exc:  # a failed worker: its intervals' leases lapse, a new job takes them
                if self._stopping.is_set():
                    return
                if "headrace.errors." in str(exc):
                    self.errors.append(_job_error(exc))
                    return
                self.resubmissions += 1
                failures.append(time.monotonic())
                if len(failures) >= 10 and failures[-1] - failures[-10] < 60:
                    self.errors.append(UserCodeError(
                        "The continuous workers failed 10 times in a minute", got_text=str(exc).splitlines()[0],
                        hint="see the Spark logs for the cause; every interval resumes from its last commit"))
                    return
                time.sleep(0.2)

    def stop(self) -> None:
        self._stopping.set()
        for injector in self.injectors.values():
            injector.stop()
        for sink in self.sinks:
            sink.stop()
        if self.watcher is not None:
            self.watcher.stop()
        try:
            self.store.put_meta(f"stop:{self.run_id}", "1")
        finally:
            if self._job is not None:
                self._job.join(timeout=15)
                if self._job.is_alive():
                    self.spark.sparkContext.cancelJobGroup(JOB_GROUP)
                    self._job.join(timeout=15)
            try:
                self._stop_progress()
            finally:
                self.store.close()

    def _stop_progress(self) -> None:
        """The progress queries' final events: the workers' last commits journaled, then reported.
        A superseded driver (or a store that fails now) stops them where they were."""
        if not self.progress_queries:
            return
        if self._authority is not None:
            self._authority.join(timeout=5)
        try:
            self.refresh_watermarks()
            flush = 5.0
        except Exception:  # noqa: BLE001 - FencedWriterError, or the store's own error: no final event
            flush = 0.0
        stop_progress(self.progress_queries.values(), flush)

    # -- the watermark authority -------------------------------------------------------------------

    def refresh_watermarks(self, store: Any = None) -> dict[str, tuple[int, int]]:
        """Journal each computation's low watermarks: the minimum over its intervals' reports
        (the watermarks each interval journaled with its last commit). An interval that never
        committed holds it at the beginning of time."""
        store = store or self.store
        current = store.get_meta(self.driver[0])
        if current != self.driver[1]:
            raise FencedWriterError(f"Driver {self.driver[1]} of topology {self.topology.name!r} was superseded",
                                    got=f"newer driver {current}",
                                    hint="another run of this topology took over its store; this process is a zombie "
                                         "and stops (its workers' writes are refused)")
        for spec in self.topology.computations.values():
            if spec.name in self.removed:
                continue
            inp, out = store.low_watermarks(self._parts(spec.name))
            if self._marks.get(spec.name) != (inp, out):
                last = store.latest_batch(spec.name)
                store.complete_batch(spec.name, (last.batch if last else 0) + 1, inp, out)
                self._marks[spec.name] = (inp, out)
        return dict(self._marks)

    # -- waiting ------------------------------------------------------------------------------------

    def drained(self) -> bool:
        return (all(i.finished.is_set() for i in self.injectors.values())
                and all(self._marks.get(n, (0, 0))[1] == END_OF_TIME
                        for n in self.topology.computations if n not in self.removed))

    def check(self) -> None:
        try:
            check_injectors(self.errors, self.injectors)
            for query in [*self.sinks, *self.progress_queries.values()]:
                query.check()
        except Exception as exc:
            record_error(self.store, blamed(self.topology, exc), exc)
            raise

    def wait(self, timeout_s: float | None = None) -> RunResult:
        deadline = None if timeout_s is None else time.time() + timeout_s
        last_report = time.time()
        while True:
            if self.drained():
                break
            self.check()
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"topology {self.topology.name!r} did not drain in {timeout_s} s: "
                                   + self.describe())
            if self.progress is not None and time.time() - last_report >= self.progress_every_s:
                print(self.describe(), file=self.progress, flush=True)
                last_report = time.time()
            time.sleep(0.05)
        for sink in self.sinks:
            sink.flush()
        flush_progress(self.progress_queries.values())
        self.check()
        return self.result()

    def result(self) -> RunResult:
        stats = {}
        for name in self.topology.computations:
            inp, out = self._marks.get(name, (BEGINNING_OF_TIME, BEGINNING_OF_TIME))
            stats[name] = QueryStats(self.batches(name), inp, out, self.store.counters(name), 0.0)
        return RunResult(time.time() - self._started, stats, {p: i.published for p, i in self.injectors.items()},
                         ui_url(self.spark))

    def watermarks(self) -> dict[str, tuple[int, int]]:
        marks = {p: (i.watermark, i.watermark) for p, i in self.injectors.items()}
        marks.update(self._marks)
        return marks

    def describe(self) -> str:
        parts = []
        for name, (_, out) in self.watermarks().items():
            shown = "end" if out == END_OF_TIME else "start" if out == BEGINNING_OF_TIME else str(out)
            parts.append(f"{name}: wm={shown}")
        return "; ".join(parts)


def _job_error(exc: BaseException) -> UserCodeError:
    return UserCodeError("A continuous worker failed", got_text=failure_detail(exc),
                         hint="fix the cause and run again: every interval resumes from its last commit")
