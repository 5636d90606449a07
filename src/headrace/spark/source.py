"""The ``headrace`` Spark streaming source: a micro-batch computation's batches, run where they are read.

An offset is ``{"b": {producer: last completed batch}, "wall": ms}``. A micro-batch covers what the
computation's producers completed in (start, end]. Its read tasks are its shard tasks: each owns
some of the computation's shards, reads their input through the intake (``engine/intake.py``:
their routed segments, and the streams' segments keyed in the task where a batch is not routed
for the computation), and runs each of its shards' batch (``run_shard_batch``: load, dedup, user
code, one conditional commit). A task yields one result row per shard, for the driver's
``finish_batch``. No row travels between Spark tasks: no shuffle, and no value crosses into the
JVM.

The watermarks before and after the batch and its wall clock are derived from the offsets alone,
and its batch number from Spark's offset log (the batch whose logged end offset this is, plus
one), so a batch Spark replays after a crash sees exactly what the first attempt saw and finds its
shards' commits already made. The offset moves when a producer completes a batch (data or only a
watermark) or when a wall timer of the consumer falls due, which starts a batch even with no
records, so timers fire.
"""

from __future__ import annotations

import base64
import json
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from ..engine import DedupCache, ShardBatch, run_shard_batch
from ..engine.batch import Routing
from ..engine.failures import construct
from ..engine.consumer import Consumer, Range, input_watermark, plan_ranges
from ..engine.intake import gather
from ..engine.monoid import Folder
from ..engine.routing import EMPTY_PLAN, RoutingPlan
from ..engine.runner import collector_paused
from ..errors import HeadraceError, OptionError
from ..model import BEGINNING_OF_TIME, Computation, MonoidComputation
from ..store import open_store, shared_store
from .checkpoints import logged_batch
from .shipping import put_shipped_on_path

__all__ = ["HeadraceSource", "ShardPlan", "encode_plan", "batch_watermark", "RESULT_SCHEMA"]

# One row per shard a task ran: how its batch ended, and what it read, for the driver
RESULT_SCHEMA = pa.schema([
    ("shard", pa.int32()), ("batch", pa.int64()), ("since", pa.int64()), ("outcome", pa.string()),
    ("counters", pa.string()), ("productions", pa.int64()), ("records", pa.int64()), ("rejected", pa.int64()),
    ("watermark", pa.int64()),
])
_DDL_TYPES = {pa.int32(): "INT", pa.int64(): "BIGINT", pa.string(): "STRING"}
RESULT_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in RESULT_SCHEMA)

_DEDUP = DedupCache()  # per Python worker process, kept between batches


@dataclass(frozen=True)
class ShardPlan:
    """What a micro-batch computation's tasks need to run its batches: its read side and class,
    its output streams, whom its productions are routed for, the sequencer it commits under, and
    the py-files shipped to the executors (``spark/shipping.py``), which its user code may import."""

    consumer: Consumer
    cls: type[Computation]
    outputs: frozenset[str] = frozenset()
    routing: RoutingPlan = EMPTY_PLAN
    sequencer: int = 0
    py_files: tuple[str, ...] = ()


def encode_plan(plan: ShardPlan) -> str:
    """A computation's ``ShardPlan``, for the source's options."""
    from pyspark import cloudpickle

    return base64.b64encode(cloudpickle.dumps(plan)).decode()


def _decode_plan(text: str) -> ShardPlan:
    plan: ShardPlan = pickle.loads(base64.b64decode(text))
    return plan


def batch_watermark(store: Any, consumer: Consumer, offset: dict[str, Any]) -> int:
    """The consumer's input low watermark once it has read up to ``offset``."""
    heads = store.heads_at(offset.get("b", {}))
    return input_watermark(consumer, lambda p: heads[p].output_watermark if p in heads else BEGINNING_OF_TIME)


@dataclass
class ReadPart(InputPartition):
    """One task of batch ``batch``: ``ranges`` of the consumer's shards ``dests``; ``since``: this
    run's first batch (the routing plan's start); ``control``: the input watermark before and after
    the batch, and its wall clock; ``producers``: per input stream, its producers as the planner
    knew them (with injector parts declared since the query started)."""

    ranges: list[Range]
    dests: list[int]
    batch: int
    since: int
    control: tuple[int, int, int]
    producers: dict[str, tuple[str, ...]] = field(default_factory=dict)


class LazyStore:
    """A reader's store on the driver, opened on first use."""

    url: str
    _store: Any = None

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


class HeadraceSource(DataSource):
    """Options: ``store`` (URL), ``plan`` (``encode_plan`` of the computation's ``ShardPlan``),
    ``checkpoint`` (the query's checkpoint folder: its offset log numbers the batches), ``start``
    (``beginning``, ``now``, or milliseconds since the epoch to replay from that time),
    ``parallelism`` (how many tasks a batch may use: Spark's default parallelism)."""

    @classmethod
    def name(cls) -> str:
        return "headrace"

    def schema(self) -> str:
        return RESULT_DDL

    def streamReader(self, schema: Any) -> "HeadraceReader":
        return HeadraceReader(dict(self.options))


class HeadraceReader(LazyStore, DataSourceStreamReader):
    def __init__(self, options: dict[str, str]):
        self.url = options["store"]
        self.plan = _decode_plan(options["plan"])
        self.consumer = self.plan.consumer
        self.checkpoint = options.get("checkpoint")
        self._given = sorted(options)
        self.start = options.get("start", "beginning")
        self.parallelism = max(1, int(options.get("parallelism", "2")))
        self._since: int | None = None
        self._plans: dict[str, Any] = {}
        self._discovered = 0.0

    def _producers(self) -> list[str]:
        """Its producers, with the injector parts declared since it started (looked up each second)."""
        if time.monotonic() - self._discovered > 1.0:
            self._discovered = time.monotonic()
            self.consumer = self.consumer.with_parts({s: self.store.stream_producers(s) for s in self.consumer.inputs})
        return self.consumer.all_producers

    def initialOffset(self) -> dict[str, Any]:
        producers = self._producers()
        if self.start == "now":
            batches = self.store.latest_batches(producers)
        elif self.start == "beginning":
            batches = {}
        else:  # replay from a time: every batch completed at or after it
            batches = {p: self.store.batch_before(p, int(self.start)) for p in producers}
        return {"b": {p: batches.get(p, 0) for p in producers}, "wall": 0}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        producers = self._producers()
        heads = self.store.latest_batches(producers)
        previous = start or {"b": {}, "wall": 0}
        wall = previous.get("wall", 0)
        now = int(time.time() * 1000)
        due = self.store.next_wall_timer(self.consumer.name)
        if due is not None and due <= now and due > wall:
            wall = now
        return {"b": {p: max(heads.get(p, 0), previous["b"].get(p, 0)) for p in producers}, "wall": wall}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if self.checkpoint is None:
            raise OptionError(f"The headrace source of {self.consumer.name!r} has no checkpoint option", got=self._given,
                              hint="pass .option('checkpoint', <the query's checkpointLocation>)")
        batch = logged_batch(self.checkpoint, end)
        if batch is None:
            raise HeadraceError(f"Spark's offset log of {self.consumer.name!r} has no batch that ends at {end}",
                                got=self.checkpoint, hint="the query's checkpointLocation must be the folder passed "
                                                          "as the source's checkpoint option")
        self._since = self._since or batch  # a query's first batch may have no input: it still starts the run
        if start == end:
            return []
        consumer = self.consumer
        control = (batch_watermark(self.store, consumer, start), batch_watermark(self.store, consumer, end),
                   end.get("wall", 0))
        ranges = plan_ranges(self.store, consumer, start["b"], self.store.heads_at(end["b"]), self._plans)
        # as many tasks as cores, each with its share of the shards: a batch not routed for the
        # computation is read and keyed once per task, and every task costs a Python worker round trip
        tasks = min(self.parallelism, consumer.shards)
        return [ReadPart(ranges, list(range(i, consumer.shards, tasks)), batch, self._since, control,
                         dict(consumer.producers)) for i in range(tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part: ReadPart = partition  # type: ignore[assignment]
        # one pause for the whole task, each shard's records dropped once its batch ran: the
        # collector, back on, finds little left to walk (paused around the read alone, it walked
        # every record the task had read as soon as the read ended)
        with collector_paused():
            rows = self._run(part)
        yield pa.RecordBatch.from_pydict(rows, schema=RESULT_SCHEMA)

    def _run(self, part: ReadPart) -> dict[str, list[Any]]:
        """Read the part's input and run each of its shards' batch: their result rows."""
        # this reader was made from the query's options: the parts declared since are the planner's
        plan, consumer = self.plan, self.consumer.with_parts(part.producers)
        put_shipped_on_path(plan.py_files)
        store = shared_store(self.url)
        code = construct(plan.cls, consumer.name)
        before, after, wall = part.control
        folders: dict[int, Folder] = {}

        def folder_of(shard: int) -> Folder | None:  # a monoid's records are folded as they are read
            if not isinstance(code, MonoidComputation):
                return None
            if shard not in folders:
                folders[shard] = Folder(code, consumer.name, before)
            return folders[shard]

        records, rejected = gather(store, consumer, part.ranges, set(part.dests), None, (), folder_of,
                                   before if isinstance(code, MonoidComputation) else None)
        routing = Routing(plan.routing.id, part.since, []) if plan.routing.subscribers else None
        rows: dict[str, list[Any]] = {f.name: [] for f in RESULT_SCHEMA}
        for shard in part.dests:
            folder = folders.pop(shard, None)
            partials = folder.partials() if folder is not None else []
            batch = ShardBatch(consumer.name, shard, part.batch, records.pop(shard, []), before, after, wall,
                               plan.sequencer, consumer.dedup_streams, rejected.pop(shard, []), partials=partials)
            result = run_shard_batch(code, consumer.name, consumer.options, plan.outputs, store, batch, _DEDUP,
                                     consumer.schemas, plan.routing, routing)
            for name, value in (("shard", shard), ("batch", part.batch), ("since", part.since),
                                ("outcome", result.state.value), ("counters", json.dumps(result.counters)),
                                ("productions", len(result.productions)),
                                ("records", len(batch.records) + len(batch.rejected) + sum(p.records for p in partials)),
                                ("rejected", len(batch.rejected)), ("watermark", after)):
                rows[name].append(value)
            del batch, result, partials  # freed now, while the collector is paused
        return rows

    def commit(self, end: dict[str, Any]) -> None:
        pass
