"""One Structured Streaming query per computation.

    headrace source (``spark/source.py``: a task per group of shards reads their input through
    the intake and runs each shard's batch, one conditional transaction each) ──► a result row per
    shard, collected on the driver ──► journal the batch as complete with the computation's output
    low watermark (from the batch's offsets, as the source derives it).

The batch number every shard commits under is Spark's batch id + 1, so a batch Spark replays
after a crash finds its shards already committed and re-delivers instead of re-running.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine import finish_batch
from ..engine.batch import Routing
from ..engine.consumer import Consumer
from ..engine.routing import RoutingPlan
from ..errors import HeadraceError, UserCodeError
from ..model import BEGINNING_OF_TIME
from ..names import MICROBATCH
from ..store import open_store
from ..store.monitoring import WHOLE_COMPUTATION
from ..topology import ComputationSpec
from .checkpoints import clear_unfinished_writes, logged_offset, offsets_read
from .shipping import shipped_files
from .source import ShardPlan, batch_watermark, encode_plan

__all__ = ["ComputationQuery", "QueryStats"]


@dataclass
class QueryStats:
    batches: int = 0
    input_watermark: int = BEGINNING_OF_TIME
    output_watermark: int = BEGINNING_OF_TIME
    counters: dict[str, int] = field(default_factory=dict)


class Restartable:
    """A streaming query (a computation's, a sink's, a progress query's) that the driver starts
    again after a failure under headrace (``Driver.restartable``): ``start`` and ``stop`` are the
    subclass's."""

    query: Any

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def failure(self) -> Any:
        """The query's failure (a ``StreamingQueryException``), or None while it runs or ran well."""
        return self.query.exception() if self.query is not None else None

    def progressed(self) -> bool:
        """Whether the query completed a batch since it started."""
        return self.query is not None and self.query.lastProgress is not None

    def restart(self) -> None:
        """Start the failed query again: a sink's resumes from its checkpoint."""
        self.stop()
        self.start()


class ComputationQuery(Restartable):
    """Starts, runs and stops the streaming query of one computation."""

    def __init__(self, spark: Any, spec: ComputationSpec, consumer: Consumer, routing: RoutingPlan, store_url: str,
                 checkpoint_root: str, trigger_ms: int = 200, start: str = "beginning",
                 on_batch: Callable[[], None] | None = None):
        self.spark = spark
        self.on_batch = on_batch  # told after each batch's numbers are in ``stats``
        self.spec, self.consumer, self.routing = spec, consumer, routing
        self.url = store_url
        self.checkpoint = os.path.join(checkpoint_root, spec.name)
        self.trigger_ms = trigger_ms
        self.start_from = start
        self.store = open_store(store_url)
        self.store.register(spec.name, spec.options.shards, MICROBATCH)
        self.sequencer = self.store.acquire_writer(spec.name)
        if routing.subscribers:
            self.store.register_plan(routing.id, routing.routes)
        last = self.store.latest_batch(spec.name)
        self.stats = QueryStats()
        if last is not None:
            self.stats.input_watermark, self.stats.output_watermark = last.input_watermark, last.output_watermark
        self.error: BaseException | None = None
        self.query: Any = None
        self.last_batch_id = -1
        self._plan_since: int | None = None  # this run's first batch: every later one follows its routing plan
        self._lock = threading.Lock()

    def start(self) -> None:
        plan = ShardPlan(self.consumer, self.spec.cls, frozenset(self.spec.outputs), self.routing, self.sequencer,
                         shipped_files(self.spark))
        df = (self.spark.readStream.format("headrace")
              .option("store", self.url).option("plan", encode_plan(plan))
              .option("checkpoint", self.checkpoint).option("start", self.start_from)
              .option("parallelism", str(self.spark.sparkContext.defaultParallelism)).load())
        df = observe_progress(df)
        clear_unfinished_writes(self.checkpoint)
        self._plan_since = None
        self.query = (df.writeStream.foreachBatch(self._on_batch)
                      .option("checkpointLocation", self.checkpoint)
                      .queryName(f"headrace-{self.spec.name}-batches")
                      .trigger(processingTime=f"{self.trigger_ms} milliseconds")
                      .start())

    def _on_batch(self, df: Any, batch_id: int) -> None:
        spec, batch_no = self.spec, batch_id + 1
        end = logged_offset(os.path.join(self.checkpoint, "offsets", str(batch_id))) or {"b": {}}
        records = self.batch_records(batch_id)
        df.sparkSession.sparkContext.setJobDescription(
            f"headrace {spec.name}: batch {batch_no}, {'?' if records is None else records} records")
        self._plan_since = self._plan_since or batch_no
        results = df.collect()  # runs the batch: the source's tasks are its shard tasks
        if any((row.batch, row.since) != (batch_no, self._plan_since) for row in results):
            raise HeadraceError(f"The batch of computation {spec.name!r} ran under the wrong number",
                                got=sorted({(row.batch, row.since) for row in results}),
                                hint=f"expected batch {batch_no} (Spark's batch {batch_id} + 1) of a run since batch "
                                     f"{self._plan_since} for every shard; the query's checkpoint and its offset log "
                                     "must be its own")
        routing = Routing(self.routing.id, self._plan_since, []) if self.routing.subscribers else None
        self.last_batch_id = batch_id
        # the same watermark the source's tasks carried: both derive it from the offsets alone
        consumer = self.consumer.with_parts({s: list(end["b"]) for s in self.consumer.inputs})
        wm_after = batch_watermark(self.store, consumer, end)
        out = finish_batch(self.store, spec.name, batch_no, wm_after, self.stats.output_watermark, self.sequencer,
                           routing)
        read = offsets_read(self.checkpoint, batch_id)
        if read is not None:
            self.store.record_positions(spec.name, WHOLE_COMPUTATION, read)
        with self._lock:
            self.stats.batches += 1
            self.stats.input_watermark = max(self.stats.input_watermark, wm_after)
            self.stats.output_watermark = out
            for row in results:
                for k, v in json.loads(row.counters).items():
                    self.stats.counters[k] = self.stats.counters.get(k, 0) + v
        if self.on_batch is not None:
            self.on_batch()

    def batch_records(self, batch_id: int) -> int | None:
        """How many records Spark batch ``batch_id`` reads: its offsets are in the query's offset log
        before it runs (``None`` when the start is unknown: the first batch of a late start)."""
        end = logged_offset(os.path.join(self.checkpoint, "offsets", str(batch_id)))
        if batch_id > 0:
            start = logged_offset(os.path.join(self.checkpoint, "offsets", str(batch_id - 1)))
        else:
            start = {"b": {}} if self.start_from == "beginning" else None
        if end is None or start is None:
            return None
        return sum(self.store.segment_records(stream, p, start["b"].get(p, 0), end["b"].get(p, 0))
                   for stream, producers in self.consumer.producers.items() for p in producers)

    def progressed(self) -> bool:
        """Whether the query completed a batch (its ``_on_batch`` ran) since it started."""
        return self.last_batch_id >= 0

    def check(self) -> None:
        """Raise the query's failure, if it failed."""
        if self.failure() is not None:
            raise _query_error(self.spec.name, self.failure())

    def await_last_progress(self, timeout_s: float = 10.0) -> None:
        """Wait until Spark has reported the progress of the last batch this run handled: Spark posts
        a batch's progress event after ``_on_batch`` returns, and stopping the query first loses it."""
        import time

        deadline = time.time() + timeout_s
        while self.query is not None and self.query.isActive and time.time() < deadline:
            last = self.query.lastProgress
            if last is not None and last["batchId"] >= self.last_batch_id:
                return
            time.sleep(0.01)

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
        self.store.close()


def observe_progress(df: Any) -> Any:
    """Observed metrics in each batch's ``StreamingQueryProgress.observedMetrics["headrace_batch"]``:
    the computation's input low watermark after the batch, and the records and rejected (bad
    input) records the batch read. The counters of what its shards did are in the computation's
    progress query (``spark/progress.py``)."""
    from pyspark.sql import functions as F

    return df.observe("headrace_batch", F.max("watermark").alias("watermark"),
                      F.coalesce(F.sum("records"), F.lit(0)).alias("records"),
                      F.coalesce(F.sum("rejected"), F.lit(0)).alias("rejected"))


def failure_detail(exc: Any) -> str:
    """The line of a Spark failure that says what went wrong: the headrace error a task raised, if any."""
    text = str(exc)
    marker = "headrace.errors."
    return text[text.index(marker):].splitlines()[0] if marker in text else text.splitlines()[0] if text else repr(exc)


def _query_error(name: str, exc: Any) -> UserCodeError:
    return UserCodeError(f"The query of computation {name!r} failed", got_text=failure_detail(exc),
                         hint="fix the cause and run again: every shard resumes from its last committed batch")
