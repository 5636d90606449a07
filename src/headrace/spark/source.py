"""The ``headrace`` Spark streaming source: a consumer's view of its input streams.

An offset is ``{"b": {producer: last completed batch}, "wall": ms}``. A micro-batch reads every
segment its producers completed in (start, end] and one control row that carries the input low
watermark before and after the batch and the wall clock, all derived from the offsets alone, so a
replayed batch sees exactly what the first attempt saw. The offset moves when a producer completes
a batch (data or only a watermark) or when a wall timer of the consumer falls due, which starts a
batch even with no rows, so timers fire.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from ..engine.watermark import input_low_watermark
from ..model import BEGINNING_OF_TIME
from ..store import open_store, shared_store
from ..store.segments import decode_segment
from .keying import CONTROL, KEYED_DDL, RECORD, SOURCE_SCHEMA, Keying

__all__ = ["HeadraceSource"]



@dataclass
class ControlPartition(InputPartition):
    wm_before: int
    wm_after: int
    wall: int


@dataclass
class SegmentRange(InputPartition):
    stream: str
    producer: str
    after: int
    upto: int
    control: ControlPartition | None = None  # the batch's control row rides along with one range
    wm_before: int = BEGINNING_OF_TIME  # the batch's input watermark before: a monoid's read folds no late record


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
    """Options: ``store`` (URL), ``computation``, ``subscriptions`` (JSON list of [stream, producer]),
    ``start`` (``beginning``, ``now``, or milliseconds since the epoch to replay from that time),
    ``keying`` (the consumer's ``Keying``, serialized: rows come out keyed and bound to a shard),
    ``parallelism`` (how many read tasks a batch may use: Spark's default parallelism),
    ``percentiles`` (JSON ``{stream: p}``: the computation's ``watermark_percentile``)."""

    @classmethod
    def name(cls) -> str:
        return "headrace"

    def schema(self) -> str:
        return KEYED_DDL

    def streamReader(self, schema: Any) -> "HeadraceReader":
        return HeadraceReader(self.options)


class HeadraceReader(LazyStore, DataSourceStreamReader):
    def __init__(self, options: dict[str, str]):
        self.url = options["store"]
        self.computation = options["computation"]
        self.subscriptions: list[tuple[str, str]] = [tuple(s) for s in json.loads(options["subscriptions"])]
        self.producers = sorted({p for _, p in self.subscriptions})
        self.start = options.get("start", "beginning")
        self.keying = Keying.from_option(options["keying"])
        self.parallelism = max(1, int(options.get("parallelism", "2")))
        self.percentiles: dict[str, float] = json.loads(options.get("percentiles", "{}"))

    def _latest(self) -> dict[str, int]:
        latest = {}
        for p in self.producers:
            info = self.store.latest_batch(p)
            latest[p] = info.batch if info else 0
        return latest

    def initialOffset(self) -> dict:
        if self.start == "now":
            batches = self._latest()
        elif self.start == "beginning":
            batches = {p: 0 for p in self.producers}
        else:  # replay from a time: every batch completed at or after it
            batches = {p: self.store.batch_before(p, int(self.start)) for p in self.producers}
        return {"b": batches, "wall": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        batches = self._latest()
        previous = start or {"b": {}, "wall": 0}
        wall = previous.get("wall", 0)
        now = int(time.time() * 1000)
        due = self.store.next_wall_timer(self.computation)
        if due is not None and due <= now and due > wall:
            wall = now
        return {"b": {p: max(batches[p], previous["b"].get(p, 0)) for p in self.producers}, "wall": wall}

    def _watermark(self, offset: dict) -> int:
        marks: dict[str, int] = {}
        for p in self.producers:
            batch = offset["b"].get(p, 0)
            info = self.store.batch_info(p, batch) if batch else None
            marks[p] = info.output_watermark if info else BEGINNING_OF_TIME
        streams: dict[str, list[int]] = {}
        for stream, producer in self.subscriptions:
            streams.setdefault(stream, []).append(marks[producer])
        return min((input_low_watermark(ms, self.percentiles.get(s, 100.0)) for s, ms in streams.items()),
                   default=input_low_watermark([]))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if start == end:
            return []
        control = ControlPartition(self._watermark(start), self._watermark(end), end.get("wall", 0))
        parts: list[SegmentRange] = []
        for stream, producer in self.subscriptions:
            first, last = start["b"].get(producer, 0), end["b"][producer]
            # as many read tasks as cores: enough to read and key on all of them, and no more,
            # since every task costs a round trip to a Python worker whatever its size
            step = max(1, -(-(last - first) // self.parallelism))
            parts.extend(SegmentRange(stream, producer, b, min(b + step, last), wm_before=control.wm_before)
                         for b in range(first, last, step))
        if not parts:
            return [control]
        parts[0].control = control
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        control = partition if isinstance(partition, ControlPartition) else partition.control  # type: ignore[attr-defined]
        if control is not None:
            yield self.keying.apply(pa.RecordBatch.from_pydict({
                "kind": [CONTROL], "stream": [None], "key": [None], "value": [None], "timestamp": [0], "id": [None],
                "wm_before": [control.wm_before], "wm_after": [control.wm_after], "wall": [control.wall],
            }, schema=SOURCE_SCHEMA))
        if not isinstance(partition, SegmentRange):
            return
        store = shared_store(self.url)
        folder = self.keying.folder(partition.wm_before)
        for _, _, blob in store.segment_blobs(partition.stream, partition.producer, partition.after, partition.upto):
            table = decode_segment(blob)
            if folder is not None:
                table = self.keying.fold_fields(table, partition.stream, folder)
            for rb in _as_source_batches(table, partition.stream):
                yield self.keying.apply(rb, folder)
        if folder is not None and folder.slots:
            yield self.keying.partial_rows(folder)

    def commit(self, end: dict) -> None:
        pass


def _as_source_batches(table: pa.Table, stream: str) -> Iterator[pa.RecordBatch]:
    n = table.num_rows
    if n == 0:
        return
    zeros = pa.array([0] * n, pa.int64())
    full = pa.table({
        "kind": pa.array([RECORD] * n, pa.int8()),
        "stream": pa.array([stream] * n, pa.string()),
        "key": table.column("key"), "value": table.column("value"),
        "timestamp": table.column("timestamp"), "id": table.column("id"),
        "wm_before": zeros, "wm_after": zeros, "wall": zeros,
    }, schema=SOURCE_SCHEMA)
    yield from full.to_batches()
