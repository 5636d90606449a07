"""The ``headrace`` Spark streaming source: a micro-batch computation's view of its input streams.

An offset is ``{"b": {producer: last completed batch}, "wall": ms}``. A micro-batch reads what its
producers completed in (start, end] through the intake (``engine/intake.py``): the computation's
routed segments, split among the read tasks by shard, and, for batches not routed for it, the
streams' segments, split by batch and keyed in the read. One control row per shard carries the
input low watermark before and after the batch and the wall clock, all derived from the offsets
alone, so a replayed batch sees exactly what the first attempt saw. The offset moves when a
producer completes a batch (data or only a watermark) or when a wall timer of the consumer falls
due, which starts a batch even with no rows, so timers fire.
"""

from __future__ import annotations

import base64
import json
import pickle
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from ..engine.failures import construct
from ..engine.intake import Consumer, Range, input_watermark, plan_ranges, read_keyed, select
from ..engine.monoid import Folder
from ..model import BEGINNING_OF_TIME, Computation, MonoidComputation
from ..store import open_store, shared_store
from .rows import ROW_DDL, control_rows, partial_rows, partition_labels, selected_rows

__all__ = ["HeadraceSource", "encode_plan", "batch_watermark"]


def encode_plan(consumer: Consumer, cls: type[Computation]) -> str:
    """A computation's read side and class, for the source's options."""
    from pyspark import cloudpickle

    return base64.b64encode(cloudpickle.dumps((consumer, cls))).decode()


def _decode_plan(text: str) -> tuple[Consumer, type[Computation]]:
    consumer, cls = pickle.loads(base64.b64decode(text))
    return consumer, cls


def batch_watermark(store: Any, consumer: Consumer, offset: dict[str, Any]) -> int:
    """The consumer's input low watermark once it has read up to ``offset``."""
    heads = store.heads_at(offset.get("b", {}))
    return input_watermark(consumer, lambda p: heads[p].output_watermark if p in heads else BEGINNING_OF_TIME)


@dataclass
class ReadPart(InputPartition):
    """One read task: ``ranges`` of the consumer's shards ``dests`` (every shard: None)."""

    ranges: list[Range]
    dests: list[int] | None
    wm_before: int  # the batch's input watermark before: a monoid's read folds no late record
    control: tuple[int, int, int] | None = None  # (watermark before, after, wall clock): the first part's


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
    """Options: ``store`` (URL), ``plan`` (``encode_plan``: the computation's read side and class),
    ``start`` (``beginning``, ``now``, or milliseconds since the epoch to replay from that time),
    ``parallelism`` (how many read tasks a batch may use: Spark's default parallelism)."""

    @classmethod
    def name(cls) -> str:
        return "headrace"

    def schema(self) -> str:
        return ROW_DDL

    def streamReader(self, schema: Any) -> "HeadraceReader":
        return HeadraceReader(dict(self.options))


class HeadraceReader(LazyStore, DataSourceStreamReader):
    def __init__(self, options: dict[str, str]):
        self.url = options["store"]
        self.consumer, self.cls = _decode_plan(options["plan"])
        self.start = options.get("start", "beginning")
        self.parallelism = max(1, int(options.get("parallelism", "2")))
        self.labels = partition_labels(self.consumer.shards)
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
        if start == end:
            return []
        consumer = self.consumer
        control = (batch_watermark(self.store, consumer, start), batch_watermark(self.store, consumer, end),
                   end.get("wall", 0))
        ranges = plan_ranges(self.store, consumer, start["b"], self.store.heads_at(end["b"]), self._plans)
        routed = [r for r in ranges if r.layout == consumer.shards]
        keyed_here = [r for r in ranges if r.layout != consumer.shards]
        # as many read tasks as cores: enough to read on all of them, and no more, since every
        # task costs a round trip to a Python worker whatever its size
        tasks = min(self.parallelism, consumer.shards)
        before = control[0]
        parts = [ReadPart(routed, list(range(i, consumer.shards, tasks)), before) for i in range(tasks)] if routed else []
        for r in keyed_here:
            step = max(1, -(-(r.upto - r.after) // self.parallelism))
            parts.extend(ReadPart([r._replace(after=b, upto=min(b + step, r.upto))], None, before)
                         for b in range(r.after, r.upto, step))
        if not parts:
            return [ReadPart([], [], before, control)]
        parts[0].control = control
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part: ReadPart = partition  # type: ignore[assignment]
        consumer = self.consumer
        if part.control is not None:
            yield control_rows(consumer.shards, self.labels, *part.control)
        if not part.ranges:
            return
        store = shared_store(self.url)
        folders: dict[int, Folder] = {}
        monoid = construct(self.cls, self.consumer.name) if issubclass(self.cls, MonoidComputation) else None

        def folder_of(shard: int) -> Folder | None:
            if monoid is None:
                return None
            if shard not in folders:
                folders[shard] = Folder(monoid, consumer.name, part.wm_before)
            return folders[shard]

        keyed = read_keyed(store, consumer, part.ranges, part.dests, {})
        for picked in select(consumer, keyed, None if part.dests is None else set(part.dests), (), folder_of,
                             part.wm_before if monoid is not None else None):
            yield selected_rows(picked, self.labels, consumer.schemas)
        if any(f.slots for f in folders.values()):
            yield partial_rows(folders, self.labels)

    def commit(self, end: dict[str, Any]) -> None:
        pass
