"""headrace's numbers in Spark's streaming progress events, in both execution modes.

Per computation the driver runs a light streaming query named ``headrace-<computation>``:

    headrace_status source ──► .observe("headrace", ...) ──► noop sink

The source reads the computation's watermarks and counters from the store (``progress_of``) and
emits one row when they changed since its last row, so each progress event's
``observedMetrics["headrace"]`` holds them. It is the one route in both modes: a continuous
computation has no streaming query of its own, and the numbers are the store's cumulative
counters (docs/monitoring.md, "In Spark's progress events").
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from typing import Any, Iterable, Iterator, Mapping

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from ..errors import OptionError, UserCodeError
from ..monitor.status import progress_of
from ..store import open_store
from .query import Restartable, failure_detail
from .source import LazyStore

__all__ = ["StatusQuery", "METRICS", "check_progress_queries", "flush_progress", "start_progress", "stop_progress"]

# the columns of a status row, each observed as its own metric
METRICS = ("watermark", "output_watermark", "watermark_lag_ms", "records", "late_dropped", "late_delivered",
           "dead_letters")
_CHANGES = [m for m in METRICS if m != "watermark_lag_ms"]  # the lag moves with the clock alone
Row = tuple[int | None, ...]  # a status row: METRICS' values


class StatusSource(DataSource):
    """Options: ``store`` (URL) and ``computation``."""

    @classmethod
    def name(cls) -> str:
        return "headrace_status"

    def schema(self) -> str:
        return ", ".join(f"{m} long" for m in METRICS)

    def simpleStreamReader(self, schema: Any) -> "StatusReader":
        return StatusReader(self.options)


class StatusReader(LazyStore, SimpleDataSourceStreamReader):
    """An offset is ``{"n": rows emitted, "seen": the numbers of the last row}``: a row goes out only
    when the numbers changed, so an idle or finished computation starts no batches."""

    def __init__(self, options: Mapping[str, str]):
        self.url = options["store"]
        self.computation = options["computation"]

    def initialOffset(self) -> dict[str, Any]:
        return {"n": 0, "seen": ""}

    def _row(self) -> tuple[Row, str]:
        numbers = progress_of(self.store, self.computation)
        return tuple(numbers[m] for m in METRICS), json.dumps([numbers[m] for m in _CHANGES])

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Row], dict[str, Any]]:
        row, seen = self._row()
        if seen == start.get("seen"):
            return iter(()), start
        return iter([row]), {"n": int(start.get("n", 0)) + 1, "seen": seen}

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Row]:
        # a batch replayed after a restart: today's numbers stand in for the lost ones
        return iter([self._row()[0]])

    def commit(self, end: dict[str, Any]) -> None:
        pass


class StatusQuery(Restartable):
    """The progress query of one computation: started and stopped with the run."""

    def __init__(self, spark: Any, computation: str, url: str, trigger_ms: int = 1_000):
        self.spark, self.computation, self.url, self.trigger_ms = spark, computation, url, trigger_ms
        # a checkpoint of its own per run: the numbers are read afresh anyway, and two drivers of a
        # topology (a zombie and its successor) must not share one
        self.checkpoint = tempfile.mkdtemp(prefix=f"headrace-progress-{computation}-")
        self.query: Any = None

    def start(self) -> "StatusQuery":
        from pyspark.sql import functions as F

        self.spark.dataSource.register(StatusSource)
        df = (self.spark.readStream.format("headrace_status")
              .option("store", self.url).option("computation", self.computation).load())
        df = df.observe("headrace", *(F.max(m).alias(m) for m in METRICS))
        self.query = (df.writeStream.format("noop").queryName(f"headrace-{self.computation}")
                      .option("checkpointLocation", self.checkpoint)
                      .trigger(processingTime=f"{self.trigger_ms} milliseconds").start())
        return self

    def shows(self, store: Any) -> bool:
        """Whether the query's last progress event with numbers (an idle query's events have none)
        carries the computation's numbers in ``store`` now."""
        events = self.query.recentProgress if self.query is not None else []
        shown = next((e.observedMetrics["headrace"] for e in reversed(events) if "headrace" in e.observedMetrics), None)
        numbers = progress_of(store, self.computation)
        return shown is not None and all(shown[m] == numbers[m] for m in _CHANGES)

    def check(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise UserCodeError(f"The progress query of computation {self.computation!r} failed",
                                got_text=failure_detail(self.query.exception()),
                                hint="see the Spark logs; the query only reports, the computation's results are safe")

    def stop(self) -> None:
        try:
            if self.query is not None:
                self.query.stop()
        finally:
            shutil.rmtree(self.checkpoint, ignore_errors=True)


def check_progress_queries(value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError("progress_queries is True (each computation's numbers in Spark's progress events) or False",
                          got=value, hint="progress_queries=False runs no progress query")
    return value


def flush_progress(queries: Iterable[StatusQuery], timeout_s: float = 30.0) -> bool:
    """Once the run has drained: wait until each progress query's last event carries the store's
    final numbers (a trigger at most, since each run's query emits its first row at once); False
    if one did not within ``timeout_s`` (the events are for watching: the run goes on)."""
    pending = list(queries)
    if not pending:
        return True
    store = open_store(pending[0].url)
    deadline = time.monotonic() + timeout_s
    try:
        while pending and time.monotonic() < deadline:
            pending = [q for q in pending if q.query is not None and q.query.isActive and not q.shows(store)]
            if pending:
                time.sleep(0.05)
        return not pending
    finally:
        store.close()


def stop_progress(queries: Iterable[StatusQuery], timeout_s: float = 5.0) -> None:
    """Stop the progress queries once the computations have stopped, after each has posted an event
    with the store's final numbers (waiting ``timeout_s`` at most): a run stopped while its input
    goes on ends with the numbers it stopped at, as a drained one does."""
    queries = list(queries)
    try:
        if timeout_s > 0:
            flush_progress(queries, timeout_s)
    except Exception:  # noqa: BLE001 - the events are for watching: a store that fails here must not stop the stop
        pass
    finally:
        for query in queries:
            query.stop()


def start_progress(spark: Any, names: list[str], url: str) -> dict[str, StatusQuery]:
    """A started progress query for each computation in ``names``."""
    return {name: StatusQuery(spark, name, url).start() for name in names}
