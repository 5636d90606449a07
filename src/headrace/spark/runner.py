"""The driver: injector threads, one streaming query per computation, progress, and drain."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TextIO

from ..engine.batch import Production, id_prefix
from ..errors import HeadraceError, OptionError, UserCodeError
from ..injectors import Injector, RecordsInjector, Several
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..monitor.events import blamed, record_error
from ..monitor.graph import record_topology
from ..monitor.watch import Watcher, announce_metrics, check_metrics_port
from ..store import DEFAULT_STORE_URL, Store, open_store
from ..schema import StreamSchema
from ..topology import Injection, Topology
from .frames import declare_schemas
from .inject import DataFrameInjector, is_streaming_dataframe
from .progress import StatusQuery, check_progress_queries, flush_progress, start_progress, stop_progress
from .query import ComputationQuery, QueryStats
from .session import spark_session, ui_url
from .shipping import prepare_user_code
from .sinks import SinkQuery, jdbc_jars, start_sinks

__all__ = ["SparkRunner", "RunResult"]


def _injectors(injection: Injection) -> list[Injector]:
    source = injection.source
    if isinstance(source, Several):
        return source.parts
    if isinstance(source, Injector):
        return [source]
    if isinstance(source, (list, tuple)):
        return [RecordsInjector(list(source))]
    raise OptionError(f"Stream {injection.stream!r} has a source headrace cannot inject", got=source,
                      hint="use a list, injectors.records(...), .generator(...), .files(...), .several(...) "
                           "or a streaming DataFrame")


class InjectorThread(threading.Thread):
    def __init__(self, stream: str, producer: str, injector: Injector, url: str,
                 on_error: Callable[[BaseException], None], schema: StreamSchema | None = None):
        super().__init__(name=f"headrace-{producer}", daemon=True)
        self.stream, self.injector, self.url, self.on_error = stream, injector, url, on_error
        self.schemas = {stream: schema} if schema is not None else None  # a typed stream: fields kept as columns
        self.producer = producer
        self.finished = threading.Event()
        self.stopping = threading.Event()
        self.watermark = BEGINNING_OF_TIME
        self.published = 0

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        store = open_store(self.url)
        try:
            last = store.latest_batch(self.producer)
            batch = last.batch if last else 0
            if last is not None and last.output_watermark == END_OF_TIME:
                self.watermark = END_OF_TIME
                self.finished.set()
                return
            for injected in self.injector.batches(store.checkpoint(self.producer)):
                if self.stopping.is_set():
                    return
                batch += 1
                prefix = id_prefix(self.producer, batch)
                prods = [Production(self.stream, None, v, ts, rid or f"{prefix}{n}")
                         for n, (v, ts, rid) in enumerate(injected.records)]
                store.publish(self.producer, batch, {self.stream: prods}, injected.watermark, injected.checkpoint,
                              self.schemas)
                self.published += len(prods)
                self.watermark = max(self.watermark, injected.watermark)
            self.finished.set()
        except BaseException as exc:  # surfaced by the runner's wait loop
            self.on_error(exc)
        finally:
            store.close()


def start_injectors(topology: Topology, url: str, checkpoint_dir: str, trigger_ms: int,
                    on_error: Callable[[BaseException], None]) -> dict[str, "InjectorThread | DataFrameInjector"]:
    """Start every injector of ``topology``: a thread per part, a Spark query per streaming DataFrame."""
    started: dict[str, InjectorThread | DataFrameInjector] = {}
    for stream, injection in topology.injections.items():
        if is_streaming_dataframe(injection.source):
            producer = injection.producers[0]
            df_injector = DataFrameInjector(injection, producer, url, checkpoint_dir, trigger_ms,
                                            topology.schemas.get(stream))
            started[producer] = df_injector
            df_injector.start()
            continue
        for producer, injector in zip(injection.producers, _injectors(injection)):
            thread = InjectorThread(stream, producer, injector, url, on_error, topology.schemas.get(stream))
            started[producer] = thread
            thread.start()
    return started


def check_injectors(errors: list[BaseException], injectors: dict[str, "InjectorThread | DataFrameInjector"]) -> None:
    """Raise the first injector failure, as the error that names it."""
    if errors:
        exc = errors[0]
        if isinstance(exc, HeadraceError):
            raise exc
        raise UserCodeError("An injector failed", got_text=f"{type(exc).__name__}: {exc}",
                            hint="fix the source; the injector resumes from its last published batch") from exc
    for i in injectors.values():
        if isinstance(i, DataFrameInjector):
            i.check()


@dataclass
class RunResult:
    elapsed_s: float
    stats: dict[str, QueryStats] = field(default_factory=dict)
    injected: dict[str, int] = field(default_factory=dict)
    ui_url: str | None = None  # the Spark web UI the run was watchable in


def announce_ui(spark: Any, progress: TextIO | None) -> None:
    url = ui_url(spark)
    if progress is not None and url:
        print(f"headrace: Spark UI at {url}", file=progress, flush=True)


def checkpoint_root(store: Store, topology: str, checkpoint_dir: str | None) -> str:
    """Where the topology's Spark checkpoints live, bound to the store they were made against:
    by default under ``<sqlite file>.checkpoints/`` (or ``./headrace.checkpoints/`` for a server
    store) and the store's instance id; a given ``checkpoint_dir`` that holds another store's
    checkpoints is refused, since Spark would resume offsets that this store never journaled."""
    instance = store.instance_id()
    if checkpoint_dir is None:
        base = store.url[len("sqlite:///"):] if store.url.startswith("sqlite:///") else os.path.abspath("headrace")
        checkpoint_dir = os.path.join(f"{base}.checkpoints", instance)
    root = os.path.join(checkpoint_dir, topology)
    marker = os.path.join(root, "STORE")
    if os.path.exists(marker):
        with open(marker) as f:
            found = f.read().strip()
        if found != instance:
            raise OptionError(f"The Spark checkpoints in {root} belong to another store", got=found,
                              hint=f"this store ({store.shown_url}) is {instance}: pass a checkpoint_dir of its own, "
                                   "or delete that directory to start the topology over")
    else:
        os.makedirs(root, exist_ok=True)
        with open(marker, "w") as f:
            f.write(instance)
    return root


def claim_mode(store: Store, topology: str, mode: str) -> None:
    """A topology runs in one execution mode for the life of its store: the modes keep their input
    positions in different places (Spark checkpoints, interval positions), so a switch would read
    every stream again from its beginning."""
    key = f"mode:{topology}"
    found = store.get_meta(key)
    if found is None:
        store.put_meta(key, mode)
    elif found != mode:
        raise OptionError(f"Topology {topology!r} already ran in {found} mode on {store.shown_url}", got=mode,
                          hint=f"run it with mode={found!r}, or start it over on a new store")


class SparkRunner:
    """Runs a topology on Spark. ``start()``, then ``wait()`` (drained) or ``stop()``."""

    def __init__(self, topology: Topology, store: str = DEFAULT_STORE_URL, master: str = "local[*]",
                 checkpoint_dir: str | None = None, trigger_ms: int = 200, progress: TextIO | None = None,
                 progress_every_s: float = 5.0, spark: Any = None, retention_ms: int | None = None,
                 metrics_port: int | None = None, ui: bool = True, py_files: Sequence[str] = (),
                 progress_queries: bool = False):
        self.topology = topology
        self.py_files = list(py_files)
        self.metrics_port = check_metrics_port(metrics_port)
        opened = open_store(store)  # validates the URL early
        try:
            self.url = opened.url
            claim_mode(opened, topology.name, "microbatch")
            self.checkpoint_root = checkpoint_root(opened, topology.name, checkpoint_dir)
            for stream in sorted(topology.streams()):
                opened.declare_stream(stream, *topology.producers(stream))
            self._record_topology(opened)
            declare_schemas(opened, topology.schemas)
        finally:
            opened.close()
        self.master = master
        self.trigger_ms = trigger_ms
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.spark = spark
        self.retention_ms = retention_ms
        self.ui = ui
        self.with_progress = check_progress_queries(progress_queries)
        self._last_trim = 0.0
        self.queries: dict[str, ComputationQuery] = {}
        self.progress_queries: dict[str, StatusQuery] = {}
        self.sinks: list[SinkQuery] = []
        self.injectors: dict[str, InjectorThread | DataFrameInjector] = {}
        self.errors: list[BaseException] = []
        self.watcher: Watcher | None = None
        self._started = 0.0
        self._batch_done = threading.Event()  # wakes ``wait`` when a computation finishes a batch

    def _record_topology(self, store: Store) -> None:
        record_topology(store, self.topology, "microbatch", {s: self.topology.producers(s) for s in self.topology.streams()})

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "SparkRunner":
        self._started = time.time()
        if self.spark is None:
            self.spark = spark_session(self.master, app_name=f"headrace-{self.topology.name}",
                                       conf=jdbc_jars(self.topology), ui=self.ui)
        announce_ui(self.spark, self.progress)
        prepare_user_code(self.spark, self.topology, self.py_files, self.progress)
        self.injectors = start_injectors(self.topology, self.url, self.checkpoint_root, self.trigger_ms,
                                         self.errors.append)
        for spec in self.topology.computations.values():
            self.add(spec.name)
        self.watcher = Watcher(self.url, metrics_port=self.metrics_port).start()
        announce_metrics(self.watcher, self.progress)
        self.sinks = start_sinks(self.spark, self.topology, self.url, self.checkpoint_root, self.trigger_ms)
        return self

    def add(self, name: str, start: str | int = "beginning") -> ComputationQuery:
        """Start the query of computation ``name`` (already in the topology) without touching the others.

        ``start``: ``"beginning"`` of its input streams, ``"now"``, or a time (ms since the epoch) to
        replay the batches its producers completed from then on. It applies to a new computation;
        a known one resumes from its Spark checkpoint. From ``"now"``, it returns once the query has
        run its first trigger, which is when it takes its starting point.
        """
        if not (start in ("beginning", "now") or (isinstance(start, int) and not isinstance(start, bool))):
            raise OptionError("A computation starts from 'beginning', 'now' or a time in ms since the epoch",
                              got=start, hint="start='beginning'")
        spec = self.topology.computation(name)
        if name not in self.queries and self.watcher is not None:  # added to a running topology
            store = open_store(self.url)
            try:
                self._record_topology(store)
            finally:
                store.close()
        query = ComputationQuery(self.spark, self.topology, spec, self.url, self.checkpoint_root,
                                 self.trigger_ms, str(start), on_batch=self._batch_done.set)
        query.start()
        self.queries[name] = query
        if self.with_progress:
            self.progress_queries.update(start_progress(self.spark, [name], self.url))
        while start == "now" and query.query is not None and query.query.isActive and query.query.lastProgress is None:
            query.check()
            time.sleep(0.02)
        query.check()
        return query

    def remove(self, name: str) -> None:
        """Stop the query of computation ``name``; the others go on."""
        self.queries.pop(name).stop()
        progress = self.progress_queries.pop(name, None)
        if progress is not None:
            progress.stop()

    def running(self, name: str) -> bool:
        query = self.queries.get(name)
        return query is not None and query.query is not None and query.query.isActive

    def batches(self, name: str) -> int:
        """How many batches computation ``name`` has completed in this run."""
        return self.queries[name].stats.batches

    def drained(self) -> bool:
        """Every injector exhausted and every computation has processed the end of time."""
        return (all(t.finished.is_set() for t in self.injectors.values())
                and all(q.stats.input_watermark == END_OF_TIME for q in self.queries.values()))

    def check(self) -> None:
        try:
            check_injectors(self.errors, self.injectors)
            for q in [*self.queries.values(), *self.progress_queries.values(), *self.sinks]:
                q.check()
        except Exception as exc:
            store = open_store(self.url)
            try:
                record_error(store, blamed(self.topology, exc), exc)
            finally:
                store.close()
            raise

    def wait(self, timeout_s: float | None = None) -> RunResult:
        """Block until drained (all injectors bounded), ``timeout_s`` passes, or Ctrl-C."""
        deadline = None if timeout_s is None else time.time() + timeout_s
        last_report = time.time()
        while True:
            self._batch_done.clear()  # before looking: a batch that ends after the look wakes the wait below
            if self.drained():
                break
            self.check()
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"topology {self.topology.name!r} did not drain in {timeout_s} s: "
                                   + self.describe())
            self.enforce_retention()
            if self.progress is not None and time.time() - last_report >= self.progress_every_s:
                print(self.describe(), file=self.progress, flush=True)
                last_report = time.time()
            self._batch_done.wait(0.1)
        for sink in self.sinks:
            sink.flush()
        for q in self.queries.values():
            q.await_last_progress()
        flush_progress(self.progress_queries.values())
        self.check()
        return self.result()

    def enforce_retention(self, every_s: float = 10.0) -> int:
        """Delete segments older than ``retention_ms`` (at most once every ``every_s``)."""
        if self.retention_ms is None or time.time() - self._last_trim < every_s:
            return 0
        self._last_trim = time.time()
        store = open_store(self.url)
        try:
            return store.trim_segments(int(time.time() * 1000) - self.retention_ms)
        finally:
            store.close()

    def result(self) -> RunResult:
        return RunResult(time.time() - self._started, {n: q.stats for n, q in self.queries.items()},
                         {s: t.published for s, t in self.injectors.items()}, ui_url(self.spark))

    def stop(self) -> None:
        for injector in self.injectors.values():
            injector.stop()
        for sink in self.sinks:
            sink.stop()
        for q in self.queries.values():
            q.stop()
        stop_progress(self.progress_queries.values())
        if self.watcher is not None:
            self.watcher.stop()

    # -- observing ----------------------------------------------------------------------------------

    def watermarks(self) -> dict[str, tuple[int, int]]:
        """Per computation: (input low watermark, output low watermark); per injector: its watermark twice."""
        marks = {p: (t.watermark, t.watermark) for p, t in self.injectors.items()}
        marks.update({n: (q.stats.input_watermark, q.stats.output_watermark) for n, q in self.queries.items()})
        return marks

    def describe(self) -> str:
        parts = []
        for name, (inp, out) in self.watermarks().items():
            shown = "end" if out == END_OF_TIME else "start" if out == BEGINNING_OF_TIME else str(out)
            batches = self.queries[name].stats.batches if name in self.queries else self.injectors[name].published
            parts.append(f"{name}: wm={shown} {'batches' if name in self.queries else 'records'}={batches}")
        return "; ".join(parts)
