"""Streams as Spark DataFrames: the ``headrace_stream`` data source behind ``headrace.stream_df``
and ``headrace.table_df``.

A row is one committed record: ``key``, ``value``, ``timestamp`` (ms since the epoch), ``id``,
``producer`` and ``batch`` (the producer's journaled batch that committed it). ``value`` is the
pickled value as it travels on the bus, or, for a stream declared with a schema
(``Topology.stream(name, schema=...)``), a struct of the schema's typed columns: the segment's own
``fields`` column when its writer kept one under that schema (an injector's, §3.7), else the
values unpickled and converted (a value that does not fit is null). A streaming
offset is ``{producer: last journaled batch}``; a micro-batch reads the journaled batches in
(start, end], so a batch Spark replays after a crash reads exactly the same records, which is what
makes a sink written from it exactly-once (docs/architecture.md §3.13).
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from ..schema import StreamSchema
from ..store import shared_store
from ..store.failpoints import failpoint_from_env
from ..store.segments import FIELDS, DecodedSegment, decode_segment
from .source import LazyStore

__all__ = ["StreamFrameSource", "stream_frame", "declare_schemas", "schema_key", "typed_values", "STREAM_READ"]

Offset = dict[str, int]  # {producer: last journaled batch}
QUIET_MOVE_S = 5.0  # how often a streaming read's offset moves over batches without records of its stream

STREAM_READ = "stream_read"  # the failpoint step (store/failpoints.py) inside a read task of the DataFrame view


def schema_key(stream: str) -> str:
    """The ``meta`` row that holds a typed stream's schema (Spark DDL), written by the runners."""
    return f"schema:{stream}"


@dataclass
class ProducerRange(InputPartition):
    producer: str
    after: int
    upto: int


class StreamFrameSource(DataSource):
    """Options: ``store``, ``stream``, ``start`` (``beginning``, ``now`` or ms since the epoch),
    ``from_batch`` (start after this batch of every producer), ``value_ddl`` (the typed schema, or empty)."""

    @classmethod
    def name(cls) -> str:
        return "headrace_stream"

    def schema(self) -> str:
        typed = self.options.get("value_ddl", "")
        value = StreamSchema(typed).struct_ddl if typed else "BINARY"
        return f"key STRING, value {value}, timestamp BIGINT, id STRING, producer STRING, batch BIGINT"

    def reader(self, schema: Any) -> "BatchFrameReader":
        return BatchFrameReader(self.options)

    def streamReader(self, schema: Any) -> "StreamFrameReader":
        return StreamFrameReader(self.options)


class _FrameReading(LazyStore):
    """What both readers share: offsets are ``{producer: last journaled batch}``."""

    def __init__(self, options: Mapping[str, str]):
        self.url, self.stream = options["store"], options["stream"]
        self.start = options.get("start", "beginning")
        self.from_batch = int(options.get("from_batch", "0"))
        ddl = options.get("value_ddl", "")
        self.typed = StreamSchema(ddl) if ddl else None
        self.parallelism = max(1, int(options.get("parallelism", "2")))

    def _heads(self) -> Offset:
        producers = self.store.stream_producers(self.stream)
        return {p: info.batch if (info := self.store.latest_batch(p)) else 0 for p in producers}

    def initialOffset(self) -> Offset:
        heads = self._heads()
        if self.start == "now":
            return heads
        if self.start == "beginning":
            return {p: self.from_batch for p in heads}
        return {p: max(self.from_batch, self.store.batch_before(p, int(self.start))) for p in heads}

    def latestOffset(self, start: Offset | None = None, limit: Any = None) -> Offset:
        previous = start or {}
        return {p: max(b, previous.get(p, 0)) for p, b in self._heads().items()}

    def ranges(self, start: Offset, end: Offset) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for producer, last in sorted(end.items()):
            first = start.get(producer, 0)
            step = max(1, -(-(last - first) // self.parallelism))
            parts.extend(ProducerRange(producer, b, min(b + step, last)) for b in range(first, last, step))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ProducerRange)
        store = shared_store(self.url)
        failpoint = failpoint_from_env()
        for batch, _, blob in store.segment_blobs(self.stream, partition.producer, partition.after, partition.upto):
            table = decode_segment(blob)
            n = table.num_rows
            if n == 0:
                continue
            values = typed_values(table, self.typed) if self.typed is not None else table.column("value")
            yield from pa.table({
                "key": table.column("key"), "value": values, "timestamp": table.column("timestamp"),
                "id": table.column("id"), "producer": pa.array([partition.producer] * n, pa.string()),
                "batch": pa.array([batch] * n, pa.int64())}).to_batches()
            if failpoint is not None:
                failpoint(STREAM_READ)


def typed_values(segment: pa.Table, schema: StreamSchema) -> pa.Array | pa.ChunkedArray:
    """A decoded segment's values as ``schema``'s struct column: its ``fields`` column when the
    writer kept one under this very schema (the same conversion of the same values, made once when
    written), else the values unpickled and converted, a value that does not fit as null."""
    if DecodedSegment(segment).fields_schema == schema.fingerprint:
        return segment.column(FIELDS)
    return schema.values(map(pickle.loads, segment.column("value").to_pylist()))


class BatchFrameReader(_FrameReading, DataSourceReader):
    def partitions(self) -> list[InputPartition]:  # everything journaled now, from where the options start
        try:
            return self.ranges(self.initialOffset(), self._heads())
        finally:
            LazyStore.stop(self)


class StreamFrameReader(_FrameReading, DataSourceStreamReader):
    """Its offset moves when the stream has new records, and otherwise (its producers journaled
    batches without records on it: watermarks, other streams) once every ``QUIET_MOVE_S``, so its
    readers' positions, which retention follows, still move. A sink's micro-batch costs a Spark job
    and a round trip to a Python worker per read task, and a stream whose records come once per
    event-time window had a sink running micro-batches back to back on empty ranges."""

    _moved_at = 0.0

    def latestOffset(self, start: Offset | None = None, limit: Any = None) -> Offset:
        latest = super().latestOffset(start, limit)
        if not start or latest == start or time.monotonic() - self._moved_at >= QUIET_MOVE_S or any(
                self._records(p, start.get(p, 0), b) for p, b in latest.items()):
            self._moved_at = time.monotonic()
            return latest
        return start

    def _records(self, producer: str, after: int, upto: int) -> int:
        return self.store.segment_records(self.stream, producer, after, upto) if upto > after else 0

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        return [r for r in self.ranges(start, end) if isinstance(r, ProducerRange) and
                self._records(r.producer, r.after, r.upto)]

    def commit(self, end: Offset) -> None:
        pass


def stream_frame(spark: Any, stream: str, url: str, value_ddl: str, *, streaming: bool,
                 start: str | int = "beginning", from_batch: int = 0) -> Any:
    """The DataFrame of ``stream``'s committed records (see ``headrace.stream_df``)."""
    spark.dataSource.register(StreamFrameSource)
    reader = spark.readStream if streaming else spark.read
    return (reader.format("headrace_stream").option("store", url).option("stream", stream)
            .option("start", str(start)).option("from_batch", str(from_batch)).option("value_ddl", value_ddl)
            .option("parallelism", str(spark.sparkContext.defaultParallelism)).load())


def declare_schemas(store: Any, schemas: dict[str, StreamSchema]) -> None:
    """Record each typed stream's schema in the store, for its DataFrame view."""
    for stream, schema in schemas.items():
        if store.get_meta(schema_key(stream)) != schema.ddl:
            store.put_meta(schema_key(stream), schema.ddl)
