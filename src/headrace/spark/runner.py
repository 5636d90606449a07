"""Micro-batch mode's driver (docs/architecture.md §4.1): one Structured Streaming query per
computation (``spark/query.py``), on the driver base (``spark/driver.py``); retention of old
segments while it waits."""

from __future__ import annotations

import time
from typing import Any, Sequence, TextIO

from ..model import END_OF_TIME
from ..names import MICROBATCH
from ..plans import consumer_of
from ..store import DEFAULT_STORE_URL
from ..topology import Topology
from .driver import Driver, RunResult, check_start
from .progress import start_progress
from .query import ComputationQuery, QueryStats

__all__ = ["MicroBatchRunner", "SparkRunner", "RunResult"]


class MicroBatchRunner(Driver):
    """Runs a topology in micro-batch mode. ``start()``, then ``wait()`` (drained) or ``stop()``."""

    mode = MICROBATCH

    def __init__(self, topology: Topology, store: str = DEFAULT_STORE_URL, master: str = "local[*]",
                 checkpoint_dir: str | None = None, trigger_ms: int = 200, progress: TextIO | None = None,
                 progress_every_s: float = 5.0, spark: Any = None, retention_ms: int | None = None,
                 metrics_port: int | None = None, ui: bool = True, py_files: Sequence[str] = (),
                 progress_queries: bool = False):
        super().__init__(topology, store, master, spark=spark, progress=progress, progress_every_s=progress_every_s,
                         metrics_port=metrics_port, ui=ui, py_files=py_files, progress_queries=progress_queries,
                         checkpoint_dir=checkpoint_dir, trigger_ms=trigger_ms, retention_ms=retention_ms)
        self.queries: dict[str, ComputationQuery] = {}

    def _start_computations(self) -> None:
        for name in self.topology.computations:
            self._start_query(name, "beginning")

    def _start_query(self, name: str, start: str | int, stats: QueryStats | None = None) -> ComputationQuery:
        spec = self.topology.computation(name)
        query = ComputationQuery(self.spark, spec, consumer_of(self.topology, name, MICROBATCH),
                                 self.routing(frozenset(spec.outputs)), self.url, self.checkpoint_root,
                                 self.trigger_ms, str(start), on_batch=self._woken.set)
        if stats is not None:  # a restarted query's numbers go on from its predecessor's
            query.stats = stats
        query.start()
        self.queries[name] = query
        return query

    def add(self, name: str, start: str | int = "beginning") -> ComputationQuery:
        """Start the query of computation ``name`` (already in the topology) without touching the others.

        ``start``: ``"beginning"`` of its input streams, ``"now"``, or a time (ms since the epoch) to
        replay the batches its producers completed from then on. It applies to a new computation;
        a known one resumes from its Spark checkpoint. From ``"now"``, it returns once the query has
        run its first trigger, which is when it takes its starting point.
        """
        check_start(start)
        self.topology.computation(name)
        self.removed.discard(name)
        self._record_topology()
        query = self._start_query(name, start)
        if self.with_progress:
            self.progress_queries.update(start_progress(self.spark, [name], self.url))
        while start == "now" and query.query is not None and query.query.isActive and query.query.lastProgress is None:
            query.check()
            time.sleep(0.02)
        query.check()
        return query

    def remove(self, name: str) -> None:
        """Stop the query of computation ``name``; the others go on."""
        self.removed.add(name)
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

    def _computations_drained(self) -> bool:
        return all(q.stats.input_watermark == END_OF_TIME for q in self.queries.values())

    def _check_computations(self) -> None:
        """A query that failed under headrace starts again from its checkpoint, with a new
        sequencer (``restartable``); one that headrace failed stays failed."""
        for name, query in list(self.queries.items()):
            if name in self.removed or self.queries.get(name) is not query:
                continue
            if self.restartable(f"the query of computation {name!r}", query):
                query.stop()
                # a known computation resumes from its checkpoint; a new one from where it was asked to
                self._start_query(name, query.start_from, query.stats)
            else:
                query.check()

    def _finish(self) -> None:
        for query in self.queries.values():
            query.await_last_progress()

    def _stop_computations(self) -> None:
        for query in self.queries.values():
            query.stop()

    def watermarks(self) -> dict[str, tuple[int, int]]:
        marks = {p: (t.watermark, t.watermark) for p, t in self.injectors.items()}
        marks.update({n: (q.stats.input_watermark, q.stats.output_watermark) for n, q in self.queries.items()})
        return marks

    def stats(self) -> dict[str, QueryStats]:
        return {n: q.stats for n, q in self.queries.items()}


SparkRunner = MicroBatchRunner  # its name before continuous mode had a driver of its own
