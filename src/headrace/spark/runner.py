"""The driver: injector threads, one streaming query per computation, progress, and drain."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from ..engine.batch import Production
from ..errors import HeadraceError, OptionError, UserCodeError
from ..injectors import Injector, RecordsInjector
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..store import open_store
from ..topology import Topology
from .query import ComputationQuery, QueryStats
from .session import spark_session

__all__ = ["SparkRunner", "RunResult"]


def injector_producer(stream: str) -> str:
    return f"inject:{stream}"


def _as_injector(stream: str, source: Any) -> Injector:
    if isinstance(source, Injector):
        return source
    if isinstance(source, (list, tuple)):
        return RecordsInjector(list(source))
    raise OptionError(f"Stream {stream!r} has a source headrace cannot inject", got=source,
                      hint="use a list, headrace.injectors.records(...), .generator(...) or .files(...)")


def _pickle_user_code_by_value(topology: Topology) -> None:
    """Ship user classes and extractors to Python workers by value, not by an import they may lack."""
    from pyspark import cloudpickle

    modules = {spec.cls.__module__ for spec in topology.computations.values()}
    for name in modules:
        module = sys.modules.get(name)
        if module is None or name.startswith("headrace") or "site-packages" in (getattr(module, "__file__", "") or ""):
            continue
        if name != "__main__":
            try:
                cloudpickle.register_pickle_by_value(module)
            except ValueError:
                pass


class InjectorThread(threading.Thread):
    def __init__(self, stream: str, injector: Injector, url: str, on_error: Callable[[BaseException], None]):
        super().__init__(name=f"headrace-inject-{stream}", daemon=True)
        self.stream, self.injector, self.url, self.on_error = stream, injector, url, on_error
        self.producer = injector_producer(stream)
        self.finished = threading.Event()
        self.stopping = threading.Event()
        self.watermark = BEGINNING_OF_TIME
        self.published = 0

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
                prods = [Production(self.stream, None, v, ts, rid or f"{self.producer}:{batch}:{n}")
                         for n, (v, ts, rid) in enumerate(injected.records)]
                store.publish(self.producer, batch, {self.stream: prods}, injected.watermark, injected.checkpoint)
                self.published += len(prods)
                self.watermark = max(self.watermark, injected.watermark)
            self.finished.set()
        except BaseException as exc:  # surfaced by the runner's wait loop
            self.on_error(exc)
        finally:
            store.close()


@dataclass
class RunResult:
    elapsed_s: float
    stats: dict[str, QueryStats] = field(default_factory=dict)
    injected: dict[str, int] = field(default_factory=dict)


class SparkRunner:
    """Runs a topology on Spark. ``start()``, then ``wait()`` (drained) or ``stop()``."""

    def __init__(self, topology: Topology, store: str = "sqlite:///headrace.db", master: str = "local[*]",
                 checkpoint_dir: str | None = None, trigger_ms: int = 200, progress: TextIO | None = None,
                 progress_every_s: float = 5.0, spark: Any = None):
        self.topology = topology
        self.url = open_store(store).url  # validates the URL early
        self.master = master
        if checkpoint_dir is None:
            base = self.url[len("sqlite:///"):] if self.url.startswith("sqlite:///") else os.path.abspath("headrace")
            checkpoint_dir = f"{base}.checkpoints"
        self.checkpoint_root = os.path.join(checkpoint_dir, topology.name)
        self.trigger_ms = trigger_ms
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.spark = spark
        self.queries: dict[str, ComputationQuery] = {}
        self.injectors: dict[str, InjectorThread] = {}
        self.errors: list[BaseException] = []
        self._started = 0.0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "SparkRunner":
        self._started = time.time()
        if self.spark is None:
            self.spark = spark_session(self.master, app_name=f"headrace-{self.topology.name}")
        _pickle_user_code_by_value(self.topology)
        for stream, injection in self.topology.injections.items():
            thread = InjectorThread(stream, _as_injector(stream, injection.source), self.url, self.errors.append)
            self.injectors[stream] = thread
            thread.start()
        for spec in self.topology.computations.values():
            self.add(spec.name)
        return self

    def add(self, name: str, start: str = "beginning") -> ComputationQuery:
        """Start the query of computation ``name`` (already in the topology) without touching the others."""
        if start not in ("beginning", "now"):
            raise OptionError("A computation starts from 'beginning' or 'now'", got=start, hint="start='beginning'")
        spec = self.topology.computation(name)
        query = ComputationQuery(self.spark, self.topology, spec, self.url, self.checkpoint_root,
                                 self.trigger_ms, start)
        query.start()
        self.queries[name] = query
        return query

    def remove(self, name: str) -> None:
        """Stop the query of computation ``name``; the others go on."""
        self.queries.pop(name).stop()

    def drained(self) -> bool:
        """Every injector exhausted and every computation has processed the end of time."""
        return (all(t.finished.is_set() for t in self.injectors.values())
                and all(q.stats.input_watermark == END_OF_TIME for q in self.queries.values()))

    def check(self) -> None:
        if self.errors:
            exc = self.errors[0]
            if isinstance(exc, HeadraceError):
                raise exc
            raise UserCodeError("An injector failed", got_text=f"{type(exc).__name__}: {exc}",
                                hint="fix the source; the injector resumes from its last published batch") from exc
        for q in self.queries.values():
            q.check()

    def wait(self, timeout_s: float | None = None) -> RunResult:
        """Block until drained (all injectors bounded), ``timeout_s`` passes, or Ctrl-C."""
        deadline = None if timeout_s is None else time.time() + timeout_s
        last_report = time.time()
        while not self.drained():
            self.check()
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"topology {self.topology.name!r} did not drain in {timeout_s} s: "
                                   + self.describe())
            if self.progress is not None and time.time() - last_report >= self.progress_every_s:
                print(self.describe(), file=self.progress, flush=True)
                last_report = time.time()
            time.sleep(0.1)
        self.check()
        return self.result()

    def result(self) -> RunResult:
        return RunResult(time.time() - self._started, {n: q.stats for n, q in self.queries.items()},
                         {s: t.published for s, t in self.injectors.items()})

    def stop(self) -> None:
        for t in self.injectors.values():
            t.stopping.set()
        for q in list(self.queries.values()):
            q.stop()

    # -- observing ----------------------------------------------------------------------------------

    def watermarks(self) -> dict[str, tuple[int, int]]:
        """Per computation: (input low watermark, output low watermark); per injector: its watermark twice."""
        marks = {injector_producer(s): (t.watermark, t.watermark) for s, t in self.injectors.items()}
        marks.update({n: (q.stats.input_watermark, q.stats.output_watermark) for n, q in self.queries.items()})
        return marks

    def describe(self) -> str:
        parts = []
        for name, (inp, out) in self.watermarks().items():
            shown = "end" if out == END_OF_TIME else "start" if out == BEGINNING_OF_TIME else str(out)
            batches = self.queries[name].stats.batches if name in self.queries else self.injectors[name[7:]].published
            parts.append(f"{name}: wm={shown} {'batches' if name in self.queries else 'records'}={batches}")
        return "; ".join(parts)
