"""One Structured Streaming query per computation.

    headrace source (read through the intake, rows bound to their shard) ──► repartition by
    shard ──► shard tasks (mapInArrow: decode, load, run user code, commit one transaction
    each) ──► collect results on the driver ──► journal the batch as complete with the
    computation's output low watermark (from the batch's offsets, as the source derives it).

The batch number every shard commits under is Spark's batch id + 1, so a batch Spark replays
after a crash finds its shards already committed and re-delivers instead of re-running.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pyarrow as pa

import pyarrow.compute as pc

from ..engine import DedupCache, InputRecord, Partial, ShardBatch, finish_batch, run_shard_batch
from ..engine.failures import construct
from ..engine.runner import collector_paused
from ..engine.batch import Routing
from ..engine.intake import Consumer, decode_rows, reject_rows
from ..engine.routing import RoutingPlan
from ..errors import UserCodeError
from ..model import BEGINNING_OF_TIME
from ..names import MICROBATCH
from ..store import open_store, shared_store
from ..store.monitoring import WHOLE_COMPUTATION
from ..topology import ComputationSpec
from .checkpoints import clear_unfinished_writes, logged_offset, offsets_read
from .rows import CHECKED, CONTROL, PARTIAL, RECORD, REJECTED, ROW_SCHEMA, ddl
from .source import batch_watermark, encode_plan

__all__ = ["ComputationQuery", "QueryStats"]

# One row per shard a task ran: how its batch ended, for the driver.
RESULT_SCHEMA = pa.schema([("shard", pa.int32()), ("outcome", pa.string()), ("counters", pa.string()),
                           ("productions", pa.int64())])
RESULT_DDL = ddl(RESULT_SCHEMA)

_DEDUP = DedupCache()


def make_shard_task(spec: ComputationSpec, consumer: Consumer, url: str, batch_no: int, sequencer: int,
                    routing_plan: RoutingPlan, routing: Routing | None) -> Callable[..., Iterator[pa.RecordBatch]]:
    name, options, cls = spec.name, spec.options, spec.cls
    outputs = frozenset(spec.outputs)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(list(batches), schema=ROW_SCHEMA)
        if table.num_rows == 0:
            return
        table = table.take(pc.sort_indices(table, [("shard", "ascending")]))  # stable: each shard's rows in order
        shards_col = table.column("shard").to_numpy()
        starts = [0, *(int(i) + 1 for i in (shards_col[1:] != shards_col[:-1]).nonzero()[0]), len(shards_col)]
        store = shared_store(url)
        computation = construct(cls, spec.name)
        rows: dict[str, list[Any]] = {"shard": [], "outcome": [], "counters": [], "productions": []}
        for lo, hi in zip(starts, starts[1:]):
            shard = int(shards_col[lo])
            with collector_paused():  # run_shard_batch pauses it too: decoding allocates as much
                control, records, rejected, partials = _shard_input(consumer, table.slice(lo, hi - lo))
            if control is None:
                continue
            wm_before, wm_after, wall = control
            batch = ShardBatch(name, shard, batch_no, records, wm_before, wm_after, wall, sequencer,
                               consumer.dedup_streams, rejected, partials=partials)
            result = run_shard_batch(computation, name, options, outputs, store, batch, _DEDUP, consumer.schemas,
                                     routing_plan, routing)
            rows["shard"].append(shard)
            rows["outcome"].append(result.state.value)
            rows["counters"].append(json.dumps(result.counters))
            rows["productions"].append(len(result.productions))
        yield pa.RecordBatch.from_pydict(rows, schema=RESULT_SCHEMA)
    return task


def _shard_input(consumer: Consumer, part: pa.Table) -> tuple[tuple[int, int, int] | None, list[InputRecord],
                                                                list[InputRecord], list[Partial]]:
    """One shard's rows as its batch's input: the control row's watermarks and wall clock, its
    records (values decoded once), its rejected ones and its partial aggregates."""
    kinds = part.column("kind").to_pylist()
    col = {name: part.column(name).to_pylist() for name in ("stream", "key", "value", "timestamp", "id", "error")}
    control = None
    records: list[InputRecord] = []
    rejected: list[InputRecord] = []
    partials: list[Partial] = []
    def at(rows: list[int], column: str) -> list[Any]:
        return [col[column][i] for i in rows]

    plain = [i for i, k in enumerate(kinds) if k in (RECORD, CHECKED)]
    if plain:
        good, bad = decode_rows(consumer, at(plain, "stream"), at(plain, "key"), at(plain, "value"),
                                at(plain, "timestamp"), at(plain, "id"), [kinds[i] == CHECKED for i in plain])
        records.extend(good)
        rejected.extend(bad)
    refused = [i for i, k in enumerate(kinds) if k == REJECTED]
    if refused:
        rejected.extend(reject_rows(consumer, at(refused, "stream"), at(refused, "value"), at(refused, "timestamp"),
                                    at(refused, "id"), at(refused, "error")))
    for i, kind in enumerate(kinds):
        if kind == PARTIAL:
            partials.append(Partial(col["key"][i], col["timestamp"][i], *pickle.loads(col["value"][i])))
        elif kind == CONTROL:
            control = (part.column("wm_before")[i].as_py(), part.column("wm_after")[i].as_py(),
                       part.column("wall")[i].as_py())
    return control, records, rejected, partials


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
        df = (self.spark.readStream.format("headrace")
              .option("store", self.url).option("plan", encode_plan(self.consumer, self.spec.cls))
              .option("start", self.start_from)
              .option("parallelism", str(self.spark.sparkContext.defaultParallelism)).load())
        df = observe_progress(df)
        clear_unfinished_writes(self.checkpoint)
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
        routing = Routing(self.routing.id, self._plan_since, []) if self.routing.subscribers else None
        results = (df.repartition(spec.options.shards, "part")
                   .mapInArrow(make_shard_task(spec, self.consumer, self.url, batch_no, self.sequencer, self.routing,
                                               routing), RESULT_DDL)
                   .collect())
        self.last_batch_id = batch_id
        # the same watermark the source's control rows carried: both derive it from the offsets alone
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
    input) rows the batch read. The numbers known only after the shard tasks are in the
    computation's progress query (``spark/progress.py``)."""
    from pyspark.sql import functions as F

    watermark = F.max(F.when(F.col("kind") == CONTROL, F.col("wm_after")))
    return df.observe("headrace_batch", watermark.alias("watermark"),
                      F.count(F.when(F.col("kind") != CONTROL, 1)).alias("records"),
                      F.count(F.when(F.col("kind") == REJECTED, 1)).alias("rejected"))


def failure_detail(exc: Any) -> str:
    """The line of a Spark failure that says what went wrong: the headrace error a task raised, if any."""
    text = str(exc)
    marker = "headrace.errors."
    return text[text.index(marker):].splitlines()[0] if marker in text else text.splitlines()[0] if text else repr(exc)


def _query_error(name: str, exc: Any) -> UserCodeError:
    return UserCodeError(f"The query of computation {name!r} failed", got_text=failure_detail(exc),
                         hint="fix the cause and run again: every shard resumes from its last committed batch")
