"""Continuous mode (docs/architecture.md §4.2): long-lived headrace workers hosted by Spark, on the
driver base (``spark/driver.py``).

    driver: injectors, the watermark authority, the background job (resubmitted if it ends)
      │ one normal, non-barrier Spark job: a task per worker slot, each a ``Worker`` loop
      ▼
    worker: leases on key intervals ─► its intervals' routed input ─► user code ─► one commit per interval

No Spark shuffle on the hot path: producers route each record to its key's interval, and a worker
reads only what its intervals own, as soon as its producer commits (it sleeps until then).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Sequence, TextIO

from ..engine.worker import IntervalPlan, Worker
from ..errors import FencedWriterError, OptionError, UserCodeError
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..monitor.events import record_fenced
from ..names import CONTINUOUS, interval, meta
from ..engine.routing import RoutingPlan
from ..plans import interval_plans, producers_of, retired_producers, routing_plan, shards_of
from ..store import open_store
from ..topology import Topology
from .driver import Driver, RunResult, check_start
from .sinks import spark_sinks
from .inject import is_streaming_dataframe
from .progress import start_progress
from .query import QueryStats, failure_detail
from .rebalancing import Rebalancer

__all__ = ["ContinuousRunner", "RunResult"]

JOB_GROUP = "headrace-continuous"
# how often a worker looks whether its run should stop (one statement): once a second; when a
# commit woke it (the driver's signal is a commit), after a tenth of one, so that the end of a run
# does not wait a second for its workers; and when a commit woke it after a pass with nothing to do
# (a drained run's stop), after a hundredth: with a tenth, the stop waited for the idle wait (a
# quarter second) that followed the deferred look, 0.27 s of a 1.6 s bounded run
STOP_CHECK_S, STOP_CHECK_WOKEN_S, STOP_CHECK_IDLE_S = 1.0, 0.1, 0.01


def _worker_task(url: str, plans: list[IntervalPlan], slots: int, topology: str, run_id: str, driver_id: str,
                 lease_ms: int) -> Any:  # noqa: C901 - the task's closures are its parts
    def task(index: int, _: Iterator[Any]) -> Iterator[str]:
        from pyspark import TaskContext

        context = TaskContext.get()
        owner = f"{socket.gethostname()}:{os.getpid()}:task{index}.{context.attemptNumber() if context else 0}"
        store = open_store(url, name="headrace-worker")
        # no lock outlives a lease: cut off mid-commit, a worker's transaction is ended by the server
        store.limit_idle_transactions(lease_ms)
        store.put_meta(meta.worker(topology, run_id, owner), json.dumps({
            "slot": index, "pid": os.getpid(), "host": socket.gethostname(),
            "stage": context.stageId() if context else None, "partition": context.partitionId() if context else None,
            "attempt": context.attemptNumber() if context else None, "started_at": int(time.time() * 1000)}))
        stop_key, driver_key = meta.stop(topology, run_id), meta.driver(topology)
        checked = {"at": 0.0, "stop": False, "woken": False}
        parent = os.getppid()

        def should_stop() -> bool:
            now = time.monotonic()
            # a commit woke the worker since it last looked (a stop is one): it looks sooner. Kept
            # until it looks, so that a stop committed just after a look is seen at the next wake-up
            # (a timeout, as no commit follows the last) rather than a second later
            checked["woken"] = checked["woken"] or worker.woken_by_commit
            every = STOP_CHECK_S if not checked["woken"] else STOP_CHECK_IDLE_S if worker.idle else STOP_CHECK_WOKEN_S
            if now - checked["at"] > every:
                # the driver asked, a newer driver of the topology took over, or the executor that
                # started this process is gone (a worker loop never talks to it, so it would not
                # notice otherwise and would renew its leases forever)
                checked["at"], checked["woken"] = now, False
                rows = store.metas_of([stop_key, driver_key])
                checked["stop"] = stop_key in rows or rows.get(driver_key) != driver_id or os.getppid() != parent
            return bool(checked["stop"])

        def fenced(computation: str, shard: int, exc: Exception) -> None:
            record_fenced(store, interval(computation, shard), run_id, owner, exc)

        reported = {"at": int(time.time() * 1000)}

        def load(intervals: dict[str, list[int]]) -> None:  # what the rebalancer reads
            now = int(time.time() * 1000)
            store.put_meta(meta.load(topology, run_id, owner),
                           json.dumps({"since": reported["at"], "at": now, "intervals": intervals}))
            reported["at"] = now

        try:
            worker = Worker(store, plans, owner, index, slots, lease_ms=lease_ms, on_fenced=fenced, on_load=load)
            worker.run(should_stop)
        finally:
            store.close()
        yield owner
    return task


class ContinuousRunner(Driver):
    """Runs a topology in continuous mode. ``start()``, then ``wait()`` (drained) or ``stop()``."""

    mode = CONTINUOUS

    def __init__(self, topology: Topology, store: str, master: str = "local[*]", *, spark: Any = None,
                 progress: TextIO | None = None, progress_every_s: float = 5.0, lease_ms: int = 3_000,
                 workers: int | None = None, authority_every_ms: int = 100, metrics_port: int | None = None,
                 ui: bool = True, py_files: Sequence[str] = (), progress_queries: bool = False,
                 checkpoint_dir: str | None = None, trigger_ms: int = 200, retention_ms: int | None = None,
                 rebalance: bool = True, rebalance_every_s: float = 5.0):
        super().__init__(topology, store, master, spark=spark, progress=progress, progress_every_s=progress_every_s,
                         metrics_port=metrics_port, ui=ui, py_files=py_files, progress_queries=progress_queries,
                         checkpoint_dir=checkpoint_dir, trigger_ms=trigger_ms, retention_ms=retention_ms)
        self.lease_ms, self.workers, self.authority_every_ms = lease_ms, workers, authority_every_ms
        self.run_id = uuid.uuid4().hex[:12]
        self._stopping = threading.Event()
        self._job: threading.Thread | None = None
        self._authority: threading.Thread | None = None
        self._marks: dict[str, tuple[int, int]] = {}
        self.retired: dict[str, tuple[str, ...]] = {}
        self.rebalance, self.rebalance_every_s = check_rebalance(rebalance), rebalance_every_s
        self.layouts: dict[str, int] = {}  # each computation's intervals now (rebalancing changes them)
        self.rebalancer: Rebalancer | None = None
        self._changing = threading.Lock()  # one change of the workers' job at a time
        self._refreshing = threading.Lock()  # the authority's rounds and the driver's own, one at a time

    # -- lifecycle ------------------------------------------------------------------------------

    def _declare(self) -> None:
        for spec in list(self.topology.computations.values()):
            # a layout the rebalancer chose stays: a restarted driver does not undo what its
            # predecessor split, unless the topology now declares another count (a rescale between runs)
            chosen = json.loads(self.store.get_meta(meta.layout(spec.name)) or "{}") if self.rebalance else {}
            rebalanced = chosen.get("shards") if chosen.get("declared") == spec.options.shards else None
            shards = self.layouts.get(spec.name, rebalanced or spec.options.shards)
            self.layouts[spec.name] = shards
            self.store.register(spec.name, shards, CONTINUOUS)
        self.retired = retired_producers({s: self.store.stream_producers(s) for s in self.topology.streams()},
                                         self.topology, self.layouts)
        super()._declare()

    def producers(self, stream: str) -> list[str]:
        return producers_of(self.topology, stream, self.mode, self.layouts)

    def routing(self, streams: frozenset[str] | None = None) -> RoutingPlan:
        running = frozenset(self._active())
        return routing_plan(self.topology, streams, running, self.layouts)

    def _start_computations(self) -> None:
        self._job = threading.Thread(target=self._run_job, name="headrace-continuous-job", daemon=True)
        self._job.start()
        if self.rebalance:
            declared = {n: s.options.shards for n, s in self.topology.computations.items()}
            self.rebalancer = Rebalancer(self.url, self.topology.name, lambda: self.run_id,
                                         lambda: {n: c for n, c in self.layouts.items() if n not in self.removed},
                                         declared, self.lease_ms, self.rescale, self.errors.append,
                                         self.rebalance_every_s).start()
        self._authority = threading.Thread(target=self._run_authority, name="headrace-watermark-authority",
                                           daemon=True)
        self._authority.start()

    def _run_authority(self) -> None:
        """The watermark authority: journals every computation's low watermarks several times a second."""
        store = open_store(self.url, name="headrace-authority")
        try:
            while not self._stopping.wait(self.authority_every_ms / 1000):
                try:
                    with self._refreshing:
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
        check_start(start)
        spec = self.topology.computation(name)
        self.removed.discard(name)
        self._declare()
        if start != "beginning":
            producers = sorted({p for s in spec.inputs for p in self.producers(s)})
            heads = self.store.latest_batches(producers) if start == "now" else {
                p: self.store.batch_before(p, int(start)) for p in producers}
            for shard in range(spec.options.shards):
                self.store.start_interval_at(name, shard, heads)
        if self.with_progress and self._job is not None and name not in self.progress_queries:
            self.progress_queries.update(start_progress(self.spark, [name], self.url))
        self._restart_job()

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
        return [interval(name, i) for i in range(shards_of(self.topology, name, self.layouts))]

    def rescale(self, name: str, shards: int) -> None:
        """Give computation ``name`` ``shards`` intervals while the topology runs: the workers' job
        stops, the store re-partitions the keys (``store/rescale.py``), the injectors route for the
        new layout, and the job starts again; every interval resumes from its commits."""
        def change() -> None:
            self.layouts[name] = shards
            declared = self.topology.computation(name).options.shards
            self.store.put_meta(meta.layout(name), json.dumps({"declared": declared, "shards": shards}))
            self._declare()
            for injector in self.injectors.values():
                injector.plan = self.routing(frozenset({injector.stream}))
        self._restart_job(change)

    def _restart_job(self, change: Callable[[], None] | None = None) -> None:
        if self._job is None:
            return
        with self._changing:
            old, self.run_id = self.run_id, uuid.uuid4().hex[:12]  # first: the old job's loop ends, not resubmits
            self.store.put_meta(meta.stop(self.topology.name, old), "1")
            self._job.join(timeout=30)
            if change is not None:
                change()
            self._job = threading.Thread(target=self._run_job, name="headrace-continuous-job", daemon=True)
            self._job.start()

    def slots(self) -> int:
        """Worker slots: the cluster's task slots less one per streaming-DataFrame injector and one
        that the sinks and the progress queries share (their queries need a slot to run; a
        progress batch is one short task), and at least one."""
        return self.workers if self.workers is not None else self._free_slots()

    def _free_slots(self) -> int:
        reserved = sum(is_streaming_dataframe(i.source) for i in self.topology.injections.values()) + bool(
            spark_sinks(self.topology) or self.with_progress)
        return max(1, self.spark.sparkContext.defaultParallelism - reserved)

    def _check_session(self) -> None:
        """More workers than the slots the run leaves free would wait for a slot for good (a
        worker's task never ends), and the run's Spark queries (sinks, streaming-DataFrame
        injectors, progress) might find none."""
        if self.workers is not None and self.workers > (free := self._free_slots()):
            total = self.spark.sparkContext.defaultParallelism
            taken = "" if free == total else f", of which the run's Spark queries (sinks, streaming-DataFrame " \
                                             f"injectors, progress) need {total - free}"
            raise OptionError(f"workers={self.workers} is more than the {free} task slots this run leaves free",
                              got=self.workers, hint=f"the session has {total} task slots{taken}, and a worker "
                                                     f"holds its slot for the whole run: ask for at most {free} "
                                                     "workers, or give Spark more cores")

    def _run_job(self) -> None:
        sc = self.spark.sparkContext
        running = frozenset(self._active())
        plans = interval_plans(self.topology, self.retired, running, self.layouts)
        run_id = self.run_id
        while not self._stopping.is_set() and run_id == self.run_id:
            slots = self.slots()
            names = ", ".join(p.name for p in plans)
            sc.setJobGroup(JOB_GROUP, f"headrace {self.topology.name}: {slots} continuous workers running {names}",
                           interruptOnCancel=True)
            task = _worker_task(self.url, plans, slots, self.topology.name, run_id, self.driver_id, self.lease_ms)
            try:
                sc.parallelize(range(slots), slots).mapPartitionsWithIndex(task).collect()
            except Exception as exc:  # a failed worker: its intervals' leases lapse, a new job takes them
                if self._stopping.is_set():
                    return
                if "headrace.errors." in str(exc):
                    self.errors.append(_job_error(exc))
                    return
                self.resubmissions += 1
                if not self._failures.spend(time.monotonic()):
                    self.errors.append(UserCodeError(
                        f"The continuous workers failed {self._failures.limit} times in a minute",
                        got_text=str(exc).splitlines()[0],
                        hint="see the Spark logs for the cause; every interval resumes from its last commit"))
                    return
                time.sleep(0.2)

    def _check_computations(self) -> None:
        pass  # a failed job puts its error in ``errors``

    def _stop_computations(self) -> None:
        self._stopping.set()
        if self.rebalancer is not None:
            self.rebalancer.stop()
        self.store.put_meta(meta.stop(self.topology.name, self.run_id), "1")
        if self._job is not None:
            self._job.join(timeout=15)
            if self._job.is_alive():
                self.spark.sparkContext.cancelJobGroup(JOB_GROUP)
                self._job.join(timeout=15)

    def _final_progress_s(self) -> float:
        """The progress queries' final events: the workers' last commits journaled, then reported.
        A superseded driver (or a store that fails now) stops them where they were."""
        if not self.progress_queries:
            return 0.0
        if self._authority is not None:
            self._authority.join(timeout=5)
        try:
            self.refresh_watermarks()
            return 5.0
        except Exception:  # noqa: BLE001 - FencedWriterError, or the store's own error: no final event
            return 0.0

    # -- the watermark authority -------------------------------------------------------------------

    def refresh_watermarks(self, store: Any = None) -> dict[str, tuple[int, int]]:
        """Journal each computation's low watermarks: the minimum over its intervals' reports
        (what each journaled with its last commit, or reported quiet since). An interval that
        never committed holds it at the beginning of time."""
        store = store or self.store
        current = store.get_meta(meta.driver(self.topology.name))
        if current != self.driver_id:
            raise FencedWriterError(f"Driver {self.driver_id} of topology {self.topology.name!r} was superseded",
                                    got=f"newer driver {current}",
                                    hint="another run of this topology took over its store; this process is a zombie "
                                         "and stops (its workers' writes are refused)")
        for spec in list(self.topology.computations.values()):
            if spec.name in self.removed:
                continue
            inp, out = store.low_watermarks(spec.name)
            if self._marks.get(spec.name) != (inp, out):
                last = store.latest_batch(spec.name)
                store.complete_batch(spec.name, (last.batch if last else 0) + 1, inp, out)
                self._marks[spec.name] = (inp, out)
        return dict(self._marks)

    # -- waiting ------------------------------------------------------------------------------------

    def _computations_drained(self) -> bool:
        """Asked once the injectors have ended: the driver's wait looks for the end itself, each
        time it looks, rather than waiting for the authority's next round (up to a tenth of a
        second after the last interval's commit). It only reads until every interval has reported
        the end of time: journaling each look's watermarks while a landed backlog was worked
        through (its injectors ended from the start) took the store's write lock from the workers."""
        if not self._at_end() and all(self.store.low_watermarks(n)[1] == END_OF_TIME for n in self._active()):
            with self._refreshing:
                self.refresh_watermarks()
        return self._at_end()

    def _at_end(self) -> bool:
        return all(self._marks.get(n, (0, 0))[1] == END_OF_TIME for n in self._active())

    def _active(self) -> list[str]:
        """The topology's computations, less those removed while it runs."""
        return [n for n in list(self.topology.computations) if n not in self.removed]

    def stats(self) -> dict[str, QueryStats]:
        out = {}
        for name in list(self.topology.computations):
            inp, out_mark = self._marks.get(name, (BEGINNING_OF_TIME, BEGINNING_OF_TIME))
            out[name] = QueryStats(self.batches(name), inp, out_mark, self.store.counters(name))
        return out

    def watermarks(self) -> dict[str, tuple[int, int]]:
        marks = {p: (i.watermark, i.watermark) for p, i in self.injectors.items()}
        marks.update(self._marks)
        return marks


def check_rebalance(value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError("rebalance must be True or False", got=value,
                          hint="rebalance=False keeps every interval where it is claimed and every layout as declared")
    return value


def _job_error(exc: BaseException) -> UserCodeError:
    return UserCodeError("A continuous worker failed", got_text=failure_detail(exc),
                         hint="fix the cause and run again: every interval resumes from its last commit")
