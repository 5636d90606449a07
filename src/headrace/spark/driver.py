"""The driver both execution modes share (docs/architecture.md §4): it claims the topology's mode
on the store and becomes its one driver, declares the bus (each stream's producers in that mode),
records the topology and its routing plans, starts the injectors, the sinks, the monitor and the
progress queries, waits until the topology has drained, describes it as it goes, and stops it.

A mode says how its computations run (``MicroBatchRunner`` in ``spark/runner.py``: a streaming
query each; ``ContinuousRunner`` in ``spark/continuous.py``: one job of worker tasks) by filling
in the ``_start_computations``, ``_check_computations``, ``drained`` and ``_stop_computations``
hooks, and what it knows of them (``watermarks``, ``batches``, ``running``).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Self, Sequence, TextIO

from ..engine.routing import RoutingPlan
from ..errors import HeadraceError, OptionError, UserCodeError
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..monitor.events import blamed, record_error
from ..monitor.graph import record_topology
from ..monitor.owners import check_owners, record_codecs
from ..monitor.watch import Watcher, announce_metrics, check_metrics_port
from ..names import MODES, meta, parse_producer, sink_reader
from ..plans import consumer_of, producers_of, routing_plan
from ..store import Store, open_store
from ..store.monitoring import WHOLE_COMPUTATION
from ..store.retention import Trimmed
from ..topology import Topology, check_retention
from .frames import declare_schemas
from .inject import DataFrameInjector
from .injectors import InjectorThread, start_injectors
from .progress import StatusQuery, check_progress_queries, flush_progress, start_progress, stop_progress
from .query import QueryStats, Restartable, failure_detail
from .session import spark_session, ui_url
from .shipping import prepare_user_code
from .budget import FailureBudget
from .checkpoints import checkpoint_root
from .kafka_sink import KafkaSink
from .sinks import SinkQuery, jdbc_jars, start_sinks

__all__ = ["Driver", "RunResult", "FailureBudget", "FRUITLESS_RESTARTS", "claim_mode", "check_start"]


@dataclass
class RunResult:
    elapsed_s: float
    stats: dict[str, QueryStats] = field(default_factory=dict)
    injected: dict[str, int] = field(default_factory=dict)
    ui_url: str | None = None  # the Spark web UI the run was watchable in


def claim_mode(store: Store, topology: Topology, mode: str) -> None:
    """A topology runs in one execution mode for the life of its store: the modes keep their input
    positions in different places (Spark checkpoints, interval positions), so a switch would read
    every stream again from its beginning. The mode a computation was registered in says it."""
    for name, found in sorted(store.computation_modes(list(topology.computations)).items()):
        if found != mode:
            raise OptionError(f"Topology {topology.name!r} already ran in {found} mode on {store.shown_url} "
                              f"(computation {name!r})", got=mode,
                              hint=f"run it with mode={found!r}, or start it over on a new store")


FRUITLESS_RESTARTS = 3  # a query restarted this often without completing a batch stays failed


def check_start(start: Any) -> None:
    if not (start in ("beginning", "now") or (isinstance(start, int) and not isinstance(start, bool))):
        raise OptionError("A computation starts from 'beginning', 'now' or a time in ms since the epoch",
                          got=start, hint="start='beginning'")


class Driver:
    """Runs a topology on Spark in one mode. ``start()``, then ``wait()`` (drained) or ``stop()``."""

    mode: str = MODES[0]
    clock: Callable[[], float] = staticmethod(time.time)  # what schedules the housekeeping

    def __init__(self, topology: Topology, store: str, master: str = "local[*]", *, spark: Any = None,
                 progress: TextIO | None = None, progress_every_s: float = 5.0, metrics_port: int | None = None,
                 ui: bool = True, py_files: Sequence[str] = (), progress_queries: bool = False,
                 checkpoint_dir: str | None = None, trigger_ms: int = 200, retention_ms: int | None = None,
                 trim_every_s: float = 10.0):
        self.topology = topology
        self.py_files = list(py_files)
        self.metrics_port = check_metrics_port(metrics_port)
        self.with_progress = check_progress_queries(progress_queries)
        self.store = open_store(store, name="headrace-driver")  # validates the URL before Spark starts
        self.url = self.store.url
        self.master, self.spark, self.ui = master, spark, ui
        self.progress, self.progress_every_s = progress, progress_every_s
        self.trigger_ms = trigger_ms
        self.retention_ms = None if retention_ms is None else check_retention("run()", retention_ms)
        self.trim_every_s, self._next_trim = trim_every_s, 0.0
        self.driver_id = uuid.uuid4().hex[:12]
        claim_mode(self.store, topology, self.mode)
        check_owners(self.store, topology)
        self.checkpoint_root = checkpoint_root(self.store, topology.name, checkpoint_dir)
        self.injectors: dict[str, InjectorThread | DataFrameInjector] = {}
        self.sinks: list[SinkQuery | KafkaSink] = []
        self.progress_queries: dict[str, StatusQuery] = {}
        self.errors: list[BaseException] = []
        self.watcher: Watcher | None = None
        self.removed: set[str] = set()
        self._started = 0.0
        self._woken = threading.Event()  # a computation finished a batch: ``wait`` looks at once
        self.resubmissions = 0  # queries (or the continuous workers' job) started again after a failure
        self._failures = FailureBudget()
        self._fruitless: dict[str, int] = {}  # per query: restarts since its last completed batch

    # -- the bus ------------------------------------------------------------------------------------

    def producers(self, stream: str) -> list[str]:
        """Who writes ``stream`` in this mode."""
        return producers_of(self.topology, stream, self.mode)

    def routing(self, streams: frozenset[str] | None = None) -> RoutingPlan:
        """Whom the producers of ``streams`` route for: the running computations that read them."""
        running = frozenset(n for n in list(self.topology.computations) if n not in self.removed)
        return routing_plan(self.topology, streams, running)

    def _declare(self) -> None:
        for stream in sorted(self.topology.streams()):
            self.store.declare_stream(stream, *self.producers(stream))
        self._record_topology()
        declare_schemas(self.store, self.topology.schemas)

    def _record_topology(self) -> None:
        record_topology(self.store, self.topology, self.mode,
                        {s: self.producers(s) for s in self.topology.streams()})
        record_codecs(self.store, self.topology)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        self._started = time.time()
        if self.spark is None:
            self.spark = spark_session(self.master, app_name=f"headrace-{self.topology.name}",
                                       conf=jdbc_jars(self.topology), ui=self.ui)
        self._check_session()
        url = ui_url(self.spark)
        if self.progress is not None and url:
            print(f"headrace: Spark UI at {url}", file=self.progress, flush=True)
        prepare_user_code(self.spark, self.topology, self.py_files, self.progress)
        # the newest driver of a topology is its only one: older ones, and their workers, stop;
        # the rows of their runs go
        self.store.put_meta(meta.driver(self.topology.name), self.driver_id)
        self.store.delete_meta(*meta.runs_of(self.topology.name))
        self._declare()
        self.watcher = Watcher(self.url, metrics_port=self.metrics_port).start()
        announce_metrics(self.watcher, self.progress)
        self.injectors = start_injectors(self.topology, self.url, self.checkpoint_root, self.trigger_ms,
                                         self.errors.append, self.routing)
        self._start_computations()
        self.sinks = start_sinks(self.spark, self.topology, self.url, self.checkpoint_root, self.trigger_ms)
        if self.with_progress:
            self.progress_queries = start_progress(self.spark, [n for n in self.topology.computations
                                                                if n not in self.removed], self.url)
        return self

    def _start_computations(self) -> None:
        raise NotImplementedError

    def _check_session(self) -> None:
        """Refuse options the session cannot serve, before anything starts."""

    def _check_computations(self) -> None:
        raise NotImplementedError

    def _stop_computations(self) -> None:
        raise NotImplementedError

    def drained(self) -> bool:
        """Every injector exhausted and every computation has processed the end of time."""
        return all(i.finished.is_set() for i in self.injectors.values()) and self._computations_drained()

    def _computations_drained(self) -> bool:
        raise NotImplementedError

    def check(self) -> None:
        """Raise the first failure of an injector, a computation, a sink or a progress query."""
        try:
            if self.errors:
                exc = self.errors[0]
                if isinstance(exc, HeadraceError):
                    raise exc
                raise UserCodeError("An injector failed", got_text=f"{type(exc).__name__}: {exc}",
                                    hint="fix the source; the injector resumes from its last published batch") from exc
            for injector in self.injectors.values():
                if isinstance(injector, DataFrameInjector):
                    injector.check()
            self._check_computations()
            for sink in self.sinks:
                # a Kafka sink is a writer thread, not a Spark query: its failures stand
                if isinstance(sink, Restartable) and self.restartable(f"the query of sink {sink.spec.name!r}", sink):
                    sink.restart()
                sink.check()
            for name, progress in self.progress_queries.items():
                if self.restartable(f"the progress query of computation {name!r}", progress):
                    progress.restart()
                progress.check()
        except Exception as exc:
            record_error(self.store, blamed(self.topology, exc), exc)
            raise

    def restartable(self, what: str, query: Restartable) -> bool:
        """Whether ``what``, a Spark query, failed and starts again from its checkpoint: when
        headrace did not raise the failure (a process under it died: a Python source's runner
        SIGKILLed, a task out of retries), the run's failure budget allows, and the query completed
        a batch since its last restart or within ``FRUITLESS_RESTARTS`` of them. A failure headrace
        raised (user code, bad input, a fence) would come back, and so would one that fails a query
        each time before its first batch."""
        failure = query.failure()
        if failure is None or "headrace.errors." in str(failure):
            return False
        fruitless = 0 if query.progressed() else self._fruitless.get(what, 0) + 1
        refused = None
        if fruitless > FRUITLESS_RESTARTS:
            refused = f"restarted {FRUITLESS_RESTARTS} times without completing a batch"
        elif not self._failures.spend(time.monotonic()):
            refused = f"{self._failures.limit} failures in {self._failures.window_s:.0f} s"
        elif (current := self.store.get_meta(meta.driver(self.topology.name))) != self.driver_id:
            refused = f"superseded by driver {current}"
        if refused is not None:  # why the failure stands, beside it
            print(f"headrace: {what} failed and is not started again: {refused}",
                  file=self.progress or sys.stderr, flush=True)
            return False
        self._fruitless[what] = fruitless
        self.resubmissions += 1
        if self.progress is not None:
            print(f"headrace: {what} failed and starts again from its checkpoint: {failure_detail(failure)}",
                  file=self.progress, flush=True)
        return True

    def _tick(self) -> None:
        """Housekeeping while ``wait`` waits: retention, every ``trim_every_s`` on a fixed schedule
        from the first trim (slots a long trim overran are skipped). Timed from the last trim's
        start instead, the trims drifted by the wait loop's granularity, 25 ms a trim, across the
        pipeline's own periodic work (event-time windows closing), and its latency drifted with them."""
        now = self.clock()
        if now < self._next_trim:
            return
        slot = self._next_trim or now  # the first trim starts the schedule
        self.trim()
        self._next_trim = slot + self.trim_every_s * max(1, math.ceil((self.clock() - slot) / self.trim_every_s))

    def trim(self) -> Trimmed:
        """Forget what every reader of the bus has read (routed segments), and what is also older
        than its stream's replay window (the run's ``retention_ms``, or ``Topology.stream``'s)."""
        readers: dict[str, dict[str, list[str]]] = {}
        for name in list(self.topology.computations):
            if name not in self.removed:
                consumer = consumer_of(self.topology, name, self.mode)
                readers[name] = {s: [*ps, *self._declared_parts(s, ps)] for s, ps in consumer.producers.items()}
        for sink in self.sinks:
            # a sink not started yet (waiting for its lease or its broker) holds what it last recorded
            written = sink.written()
            if written is not None:
                self.store.record_positions(sink_reader(sink.spec.name), WHOLE_COMPUTATION, written)
            stream = sink.spec.stream
            readers[sink_reader(sink.spec.name)] = {stream: [*self.producers(stream), *self._declared_parts(stream, [])]}
        windows = {s: self.topology.retention.get(s, self.retention_ms) for s in self.topology.streams()}
        return self.store.trim(readers, windows, self.store.now())

    def _declared_parts(self, stream: str, known: Sequence[str]) -> list[str]:
        """The injector parts of ``stream`` declared while running (a Kafka partition added)."""
        return [p for p in self.store.stream_producers(stream) if p not in known
                and (parsed := parse_producer(p)).kind == "injector" and parsed.name == stream]

    def _finish(self) -> None:
        """Once drained: what the mode does before the final progress events (its last reports)."""

    def wait(self, timeout_s: float | None = None) -> RunResult:
        """Block until drained (all injectors bounded), ``timeout_s`` passes, or Ctrl-C."""
        deadline = None if timeout_s is None else time.time() + timeout_s
        last_report = time.time()
        while True:
            self._woken.clear()  # before looking: a batch that ends after the look wakes the wait below
            if self.drained():
                break
            self.check()
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"topology {self.topology.name!r} did not drain in {timeout_s} s: "
                                   + self.describe())
            self._tick()
            if self.progress is not None and time.time() - last_report >= self.progress_every_s:
                print(self.describe(), file=self.progress, flush=True)
                last_report = time.time()
            self._woken.wait(0.05)
        for sink in self.sinks:
            sink.flush()
        self._finish()
        flush_progress(self.progress_queries.values())
        self.check()
        return self.result()

    def stop(self) -> None:
        for injector in self.injectors.values():
            injector.stop()
        for sink in self.sinks:
            sink.stop()
        if self.watcher is not None:
            self.watcher.stop()
        try:
            self._stop_computations()
        finally:
            try:
                stop_progress(self.progress_queries.values(), self._final_progress_s())
            finally:
                if self.store.get_meta(meta.driver(self.topology.name)) == self.driver_id:
                    self.store.delete_meta(*meta.runs_of(self.topology.name))
                self.store.close()

    def _final_progress_s(self) -> float:
        """How long a stopped run's progress queries may take to report where it stopped."""
        return 5.0

    # -- observing ----------------------------------------------------------------------------------

    def watermarks(self) -> dict[str, tuple[int, int]]:
        """Per computation: (input low watermark, output low watermark); per injector: its watermark twice."""
        raise NotImplementedError

    def batches(self, name: str) -> int:
        raise NotImplementedError

    def stats(self) -> dict[str, QueryStats]:
        raise NotImplementedError

    def result(self) -> RunResult:
        return RunResult(time.time() - self._started, self.stats(),
                         {p: i.published for p, i in self.injectors.items()}, ui_url(self.spark))

    def describe(self) -> str:
        parts = []
        for name, (_, out) in self.watermarks().items():
            shown = "end" if out == END_OF_TIME else "start" if out == BEGINNING_OF_TIME else str(out)
            count = (f" batches={self.batches(name)}" if name in self.topology.computations
                     else f" records={self.injectors[name].published}" if name in self.injectors else "")
            parts.append(f"{name}: wm={shown}{count}")
        return "; ".join(parts)
