"""One Structured Streaming query per computation.

    headrace source ──► extract keys (mapInArrow) ──► repartition by key shard ──► shard tasks
    (mapInArrow: load, run user code, commit one transaction each) ──► collect results on the
    driver ──► journal the batch as complete with the computation's output low watermark.

The batch number every shard commits under is Spark's batch id + 1, so a batch Spark replays
after a crash finds its shards already committed and re-delivers instead of re-running.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import pyarrow as pa

from ..engine import DedupCache, InputRecord, Partial, ShardBatch, finish_batch, run_shard_batch
from ..engine.monoid import fold_streams
from ..errors import UserCodeError
from ..model import BEGINNING_OF_TIME, MonoidComputation
from ..schema import StreamSchema
from ..store import open_store, shared_store
from ..store.monitoring import WHOLE_COMPUTATION
from ..topology import ComputationSpec, Topology
from .keying import CONTROL, KEYED_SCHEMA, PARTIAL, REJECTED, Keying, ddl

__all__ = ["ComputationQuery", "QueryStats"]

# One row per shard a task ran: how its batch ended, for the driver.
RESULT_SCHEMA = pa.schema([("shard", pa.int32()), ("outcome", pa.string()), ("counters", pa.string()),
                           ("productions", pa.int64()), ("wm_after", pa.int64())])
RESULT_DDL = ddl(RESULT_SCHEMA)

_DEDUP = DedupCache()




def make_shard_task(spec: ComputationSpec, url: str, batch_no: int, sequencer: int,
                    dedup_streams: frozenset[str], schemas: dict[str, StreamSchema]) -> Callable[..., Iterator[pa.RecordBatch]]:
    name, options, cls = spec.name, spec.options, spec.cls
    outputs = frozenset(spec.outputs)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(list(batches), schema=KEYED_SCHEMA)
        if table.num_rows == 0:
            return
        table = table.sort_by([("shard", "ascending"), ("kind", "ascending")])
        shards_col = table.column("shard").to_numpy()
        starts = [0, *(int(i) + 1 for i in (shards_col[1:] != shards_col[:-1]).nonzero()[0]), len(shards_col)]
        per_shard: dict[int, list[InputRecord]] = {}
        partials: dict[int, list[Partial]] = {}
        rejected: dict[int, list[InputRecord]] = {}
        control: dict[int, tuple[int, int, int]] = {}
        for lo, hi in zip(starts, starts[1:]):
            part = table.slice(lo, hi - lo)
            shard = int(shards_col[lo])
            kinds = part.column("kind").to_pylist()
            for kind, records in _decode_rows(part, kinds).items():
                if kind == CONTROL:
                    c = records[0]
                    control[shard] = (c.wm_before, c.wm_after, c.wall)  # type: ignore[attr-defined]
                elif kind == REJECTED:
                    rejected[shard] = [r._replace(key="") for r in records]
                elif kind == PARTIAL:
                    partials[shard] = records
                else:
                    per_shard[shard] = records
        store = shared_store(url)
        computation = cls()
        rows: dict[str, list[Any]] = {"shard": [], "outcome": [], "counters": [], "productions": [], "wm_after": []}
        for shard in sorted(control):
            wm_before, wm_after, wall = control[shard]
            batch = ShardBatch(name, shard, batch_no, per_shard.get(shard, []), wm_before, wm_after, wall,
                               sequencer, dedup_streams, rejected.get(shard, []), partials=partials.get(shard, []))
            result = run_shard_batch(computation, name, options, outputs, store, batch, _DEDUP, schemas)
            rows["shard"].append(shard)
            rows["outcome"].append(result.state.value)
            rows["counters"].append(json.dumps(result.counters))
            rows["productions"].append(len(result.productions))
            rows["wm_after"].append(wm_after)
        yield pa.RecordBatch.from_pydict(rows, schema=RESULT_SCHEMA)
    return task


class _Control(NamedTuple):
    wm_before: int
    wm_after: int
    wall: int


def _decode_rows(part: pa.Table, kinds: list[int]) -> dict[int, list[Any]]:
    """One shard's rows (sorted by kind) as InputRecords per kind, values unpickled, in bulk."""
    out: dict[int, list[Any]] = {}
    start = 0
    while start < len(kinds):
        kind = kinds[start]
        end = start
        while end < len(kinds) and kinds[end] == kind:
            end += 1
        rows = part.slice(start, end - start)
        if kind == PARTIAL:
            out[kind] = [Partial(key, window, *pickle.loads(value)) for key, window, value in zip(
                rows.column("key").to_pylist(), rows.column("timestamp").to_pylist(), rows.column("value").to_pylist())]
        elif kind == CONTROL:
            out[kind] = [_Control(rows.column("wm_before")[0].as_py(), rows.column("wm_after")[0].as_py(),
                                  rows.column("wall")[0].as_py())]
        else:
            out[kind] = list(map(InputRecord, rows.column("stream").to_pylist(), rows.column("key").to_pylist(),
                                 map(pickle.loads, rows.column("value").to_pylist()),
                                 rows.column("timestamp").to_pylist(), rows.column("id").to_pylist()))
        start = end
    return out


@dataclass
class QueryStats:
    batches: int = 0
    input_watermark: int = BEGINNING_OF_TIME
    output_watermark: int = BEGINNING_OF_TIME
    counters: dict[str, int] = field(default_factory=dict)
    last_batch_ms: float = 0.0


class ComputationQuery:
    """Starts, runs and stops the streaming query of one computation."""

    def __init__(self, spark: Any, topology: Topology, spec: ComputationSpec, store_url: str,
                 checkpoint_root: str, trigger_ms: int = 200, start: str = "beginning",
                 on_batch: Callable[[], None] | None = None):
        self.spark = spark
        self.on_batch = on_batch  # told after each batch's numbers are in ``stats``
        self.spec = spec
        self.url = store_url
        self.checkpoint = os.path.join(checkpoint_root, spec.name)
        self.trigger_ms = trigger_ms
        self.start_from = start
        self.store = open_store(store_url)
        self.store.register(spec.name, spec.options.shards)
        self.sequencer = self.store.acquire_writer(spec.name)
        self.subscriptions = [(s, p) for s in spec.inputs for p in topology.producers(s)]
        self.dedup_streams = topology.dedup_streams(spec.name)
        self.schemas = topology.checked_schemas(spec.name)
        last = self.store.latest_batch(spec.name)
        self.stats = QueryStats()
        if last is not None:
            self.stats.input_watermark, self.stats.output_watermark = last.input_watermark, last.output_watermark
        self.error: BaseException | None = None
        self.query: Any = None
        self.last_batch_id = -1
        self._lock = threading.Lock()

    def start(self) -> None:
        import time

        cls = self.spec.cls
        keying = Keying(self.spec.name, dict(self.spec.inputs), self.spec.options.shards,
                        self.spec.options.on_error == "dead_letter",
                        cls() if issubclass(cls, MonoidComputation) else None,
                        fold_streams(self.spec.inputs, self.dedup_streams), self.schemas)
        df = (self.spark.readStream.format("headrace")
              .option("store", self.url).option("computation", self.spec.name)
              .option("subscriptions", json.dumps(self.subscriptions)).option("start", self.start_from)
              .option("keying", keying.to_option())
              .option("parallelism", str(self.spark.sparkContext.defaultParallelism))
              .option("percentiles", json.dumps(dict(self.spec.options.watermark_percentile))).load())
        self._started = time.time()
        df = observe_progress(df)
        clear_unfinished_writes(self.checkpoint)
        self.query = (df.writeStream.foreachBatch(self._on_batch)
                      .option("checkpointLocation", self.checkpoint)
                      .queryName(f"headrace-{self.spec.name}-batches")
                      .trigger(processingTime=f"{self.trigger_ms} milliseconds")
                      .start())

    def _on_batch(self, df: Any, batch_id: int) -> None:
        import time

        began = time.perf_counter()
        spec, batch_no = self.spec, batch_id + 1
        shards = spec.options.shards
        records = self.batch_records(batch_id)
        df.sparkSession.sparkContext.setJobDescription(
            f"headrace {spec.name}: batch {batch_no}, {'?' if records is None else records} records")
        results = (df.repartition(shards, "part")
                   .mapInArrow(make_shard_task(spec, self.url, batch_no, self.sequencer, self.dedup_streams,
                                               self.schemas),
                               RESULT_DDL)
                   .collect())
        self.last_batch_id = batch_id
        if not results:
            return
        wm_after = results[0].wm_after
        out = finish_batch(self.store, spec.name, batch_no, wm_after, self.stats.output_watermark, self.sequencer)
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
            self.stats.last_batch_ms = (time.perf_counter() - began) * 1000
        if self.on_batch is not None:
            self.on_batch()

    def batch_records(self, batch_id: int) -> int | None:
        """How many records Spark batch ``batch_id`` reads: its offsets are in the query's offset log
        before it runs (``None`` when the start is unknown: the first batch of a late start)."""
        end = _logged_offset(os.path.join(self.checkpoint, "offsets", str(batch_id)))
        if batch_id > 0:
            start = _logged_offset(os.path.join(self.checkpoint, "offsets", str(batch_id - 1)))
        else:
            start = {"b": {}} if self.start_from == "beginning" else None
        if end is None or start is None:
            return None
        return sum(self.store.segment_records(stream, p, start["b"].get(p, 0), end["b"].get(p, 0))
                   for stream, p in self.subscriptions)

    def check(self) -> None:
        """Raise the query's failure, if it failed."""
        if self.query is not None and self.query.exception() is not None:
            raise _query_error(self.spec.name, self.query.exception())

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


def offsets_read(checkpoint: str, batch_id: int) -> dict[str, int] | None:
    """The producer batches Spark's offset log says batch ``batch_id`` read up to (its source's end
    offset, docs/monitoring.md), or None if the log is not in the expected form."""
    end = _logged_offset(os.path.join(checkpoint, "offsets", str(batch_id)))
    try:
        return {str(p): int(b) for p, b in end["b"].items()} if end is not None else None
    except (KeyError, TypeError, AttributeError, ValueError):
        return None


def clear_unfinished_writes(checkpoint: str) -> list[str]:
    """Delete the temporary files a killed driver left in a query's offset and commit logs. Spark
    writes ``.N.<uuid>.tmp`` and renames it to ``N``; a query killed before its first rename is
    refused on every restart (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``). Spark never reads a
    temporary file, and a query's checkpoint has one driver, so they are safe to delete."""
    removed = []
    for log in ("offsets", "commits"):
        folder = os.path.join(checkpoint, log)
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            if name.startswith(".") and (name.endswith(".tmp") or name.endswith(".tmp.crc")):
                os.remove(os.path.join(folder, name))
                removed.append(os.path.join(log, name))
    return removed


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


def _logged_offset(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.loads(f.read().splitlines()[-1])  # type: ignore[no-any-return]
    except (OSError, ValueError, IndexError):
        return None


def failure_detail(exc: Any) -> str:
    """The line of a Spark failure that says what went wrong: the headrace error a task raised, if any."""
    text = str(exc)
    marker = "headrace.errors."
    return text[text.index(marker):].splitlines()[0] if marker in text else text.splitlines()[0] if text else repr(exc)


def _query_error(name: str, exc: Any) -> UserCodeError:
    return UserCodeError(f"The query of computation {name!r} failed", got_text=failure_detail(exc),
                         hint="fix the cause and run again: every shard resumes from its last committed batch")
