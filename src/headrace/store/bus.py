"""The bus in the store (docs/architecture.md §3.7): the journal of every producer's completed
batches with their watermarks and routing plans, each stream's segments, and the routed segments
of keyed delivery, one per consumer interval (``engine/routing.py``)."""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from ..engine.batch import Production, Routing
from ..engine.ports import BatchInfo, Head, RoutedSegment, RouteRequest, SegmentColumns, StoredRecord
from ..errors import FencedWriterError, StaleBatchError
from ..schema import StreamSchema
from .connection import Connection
from .segments import DEFAULT_SEGMENT_LIMIT, PIECE_SLOT, pieces, routed_table, segment_columns, segment_table

__all__ = ["BusQueries", "BATCH_COLUMNS", "EncodedSegments", "head_of"]

BATCH_COLUMNS = "producer, batch, input_watermark, output_watermark, completed_at"


class EncodedSegments(NamedTuple):
    """A batch's rows of ``segments`` and ``routes``, encoded and ready to insert."""

    segments: list[tuple[Any, ...]]  # without ``created_at``, which the insert stamps
    routes: list[tuple[Any, ...]]


def _request_key(request: RouteRequest) -> tuple[Any, ...]:
    return (request.consumer, tuple(map(tuple, request.ranges)),
            None if request.dests is None else tuple(sorted(set(request.dests))))


def head_of(batch: Any, output_watermark: Any, plan: Any, plan_since: Any) -> Head:
    """A journal row's head (``batches``' columns as a query returns them)."""
    return Head(int(batch), int(output_watermark), plan, None if plan_since is None else int(plan_since))


class BusQueries(Connection):
    """Streams, segments, routed segments and the journal. A segment larger than ``segment_limit``
    bytes is stored in pieces (``segments.pieces``), which readers read in order as segments."""

    segment_limit: int = DEFAULT_SEGMENT_LIMIT  # open_store sets HEADRACE_SEGMENT_BYTES's
    _ahead: dict[tuple[Any, ...], list[RoutedSegment]] | None = None  # read_routes_ahead's, by call

    # -- the journal ------------------------------------------------------------------------------
    def _journal(self, producer: str, batch: int, input_watermark: int, output_watermark: int,
                 routing: Routing | None) -> None:
        self._write("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (producer, batch, input_watermark, output_watermark, self.now(),
                     routing.plan if routing else None, routing.since if routing else None))

    def complete_batch(self, producer: str, batch: int, input_watermark: int, output_watermark: int,
                       sequencer: int | None = None, routing: Routing | None = None) -> int:
        """Journal ``batch`` of ``producer`` as complete; returns the journaled (monotonic) output watermark."""
        with self._transaction():
            self._lock_producer(producer)
            if sequencer is not None:
                self._check_sequencer(producer, sequencer)
            prev = self._one("SELECT output_watermark, input_watermark, batch FROM batches WHERE producer = ? "
                             "ORDER BY batch DESC LIMIT 1", (producer,))
            if prev is not None and prev[2] >= batch:
                row = self._one("SELECT output_watermark FROM batches WHERE producer = ? AND batch = ?", (producer, batch))
                return int(row[0]) if row else int(prev[0])
            out = max(output_watermark, prev[0]) if prev else output_watermark
            inp = max(input_watermark, prev[1]) if prev else input_watermark
            self._journal(producer, batch, inp, out, routing)
            return out

    def _check_sequencer(self, computation: str, sequencer: int) -> None:
        row = self._one(f"SELECT sequencer FROM computations WHERE name = ?{self.FOR_SHARE}", (computation,))
        current = int(row[0]) if row else 0
        if current != sequencer:
            raise FencedWriterError(
                f"Writer of {computation!r} with sequencer {sequencer} was fenced off: the store's sequencer is {current}",
                got=sequencer,
                hint="a newer driver took over this computation; this process is a zombie and must stop",
            )


    def latest_batch(self, producer: str) -> BatchInfo | None:
        row = self._one(f"SELECT {BATCH_COLUMNS} FROM batches WHERE producer = ? ORDER BY batch DESC LIMIT 1", (producer,))
        return BatchInfo(*row) if row else None

    def batch_info(self, producer: str, batch: int) -> BatchInfo | None:
        row = self._one(f"SELECT {BATCH_COLUMNS} FROM batches WHERE producer = ? AND batch = ?", (producer, batch))
        return BatchInfo(*row) if row else None

    def latest_batches(self, producers: list[str]) -> dict[str, int]:
        """The last batch each producer journaled (absent: none yet), in one query: one index
        seek per producer (a ``GROUP BY`` over the journal would read every batch it ever had)."""
        if not producers:
            return {}
        values, param = self._values("p", producers)
        return {p: int(b) for p, b in self._all(
            f"SELECT p, (SELECT batch FROM batches WHERE producer = p ORDER BY batch DESC LIMIT 1) FROM {values}",
            (param,)) if b is not None}

    def journal_heads_of(self, producers: list[str]) -> dict[str, Head]:
        """Each producer's last journaled batch with its output watermark and routing plan, in one
        query (absent: nothing journaled yet)."""
        if not producers:
            return {}
        sql, params = self._journal_heads_query(producers)
        return {str(p): head_of(b, w, plan, since) for _, p, b, w, plan, since in self._all(sql, params)}

    def _journal_heads_query(self, producers: list[str]) -> tuple[str, list[Any]]:
        """``journal_heads_of``'s query: rows ``('j', producer, batch, output watermark, plan,
        plan since)`` (the ``'j'``: ``producer_heads`` reads them in one statement with others)."""
        values, param = self._values("p", sorted(set(producers)))
        return (f"SELECT 'j', b.producer, b.batch, b.output_watermark, b.plan, b.plan_since FROM {values} "
                f"{self._latest_batch('p', 'b')}", [param])

    def heads_at(self, positions: Mapping[str, int]) -> dict[str, Head]:
        """Each producer's journal at a given batch, as ``journal_heads_of`` gives its last (a
        producer at batch 0, or whose batch is not journaled, is absent)."""
        wanted = [(p, b, b) for p, b in sorted(positions.items()) if b > 0]
        if not wanted:
            return {}
        table, param = self._ranges(wanted)
        return {str(p): head_of(b, w, plan, since) for p, b, w, plan, since in
                self._all(f"SELECT b.producer, b.batch, b.output_watermark, b.plan, b.plan_since FROM {table} "
                          "JOIN batches b ON b.producer = p AND b.batch = hi", (param,))}

    def batch_plans(self, producer: str, after: int, upto: int) -> list[tuple[int, str | None]]:
        """The routing plan of each of ``producer``'s batches in (after, upto]."""
        return [(int(b), p) for b, p in self._all(
            "SELECT batch, plan FROM batches WHERE producer = ? AND batch > ? AND batch <= ? ORDER BY batch",
            (producer, after, upto))]

    def batches(self, producer: str, after: int = 0) -> list[BatchInfo]:
        return [BatchInfo(*r) for r in self._all(
            f"SELECT {BATCH_COLUMNS} FROM batches WHERE producer = ? AND batch > ? ORDER BY batch", (producer, after))]

    def journal_heads(self) -> list[BatchInfo]:
        """The latest journaled batch of every producer."""
        return [BatchInfo(*r) for r in self._all(
            f"SELECT {', '.join('b.' + c for c in BATCH_COLUMNS.split(', '))} FROM batches b JOIN "
            "(SELECT producer, MAX(batch) AS batch FROM batches GROUP BY producer) h "
            "ON b.producer = h.producer AND b.batch = h.batch ORDER BY b.producer")]

    def batch_before(self, producer: str, time_ms: int) -> int:
        """The last batch ``producer`` completed before ``time_ms`` (0 if none): where a replay from a time starts."""
        row = self._one("SELECT batch FROM batches WHERE producer = ? AND completed_at < ? ORDER BY batch DESC LIMIT 1",
                        (producer, time_ms))
        return int(row[0]) if row else 0

    # -- routing plans ------------------------------------------------------------------------------
    def register_plan(self, plan: str, routes: Mapping[str, Mapping[str, Any]]) -> None:
        """Record a routing plan (``RoutingPlan.routes`` under ``RoutingPlan.id``) before a batch names it."""
        self._x("INSERT INTO plans VALUES (?, ?) ON CONFLICT(id) DO NOTHING", (plan, json.dumps(routes)))

    def plan_routes(self, plan: str) -> dict[str, dict[str, list[Any]]] | None:
        """A plan's ``{stream: {consumer: [intervals, extractor fingerprint]}}``."""
        row = self._one("SELECT routes FROM plans WHERE id = ?", (plan,))
        return None if row is None else dict(json.loads(row[0]))

    # -- streams and segments -----------------------------------------------------------------------
    def declare_stream(self, stream: str, *producers: str) -> None:
        """Record that ``producers`` write ``stream``, so readers know the stream before its first
        record (in one statement: a computation of 100,000 intervals is 100,000 producers)."""
        if producers:
            values, param = self._values("p", sorted(set(producers)))
            self._x(f"INSERT INTO streams SELECT ?, p FROM {values} WHERE true ON CONFLICT(stream, producer) DO NOTHING",
                    (stream, param))

    def streams(self) -> list[str]:
        """Every stream declared or written in this store."""
        return [r[0] for r in self._all("SELECT stream FROM streams UNION SELECT DISTINCT stream FROM segments "
                                        "ORDER BY 1")]

    def stream_producers(self, stream: str) -> list[str]:
        return [r[0] for r in self._all("SELECT producer FROM streams WHERE stream = ? UNION "
                                        "SELECT DISTINCT producer FROM segments WHERE stream = ? ORDER BY 1",
                                        (stream, stream))]

    def publish(self, producer: str, batch: int, records: dict[str, list[Production]], watermark: int,
                checkpoint: str | None = None, schemas: Mapping[str, StreamSchema] | None = None,
                routing: Routing | None = None) -> None:
        """An injector's batch: its segments, its routed segments, its journal entry and its resume
        point, in one transaction.

        Publishing a batch that is already journaled does nothing, so an injector that crashed and
        replays from its last checkpoint never doubles a batch.
        """
        # encoded before the lock is taken; wasted only on a replayed batch, which the check below skips
        encoded = self._encode_segments(producer, batch, 0, records, schemas or {}, routing)
        with self._transaction():
            self._lock_producer(producer)
            prev = self.latest_batch(producer)
            if prev is not None and prev.batch >= batch:
                if prev.batch == batch or self.batch_info(producer, batch) is not None:
                    return
                raise StaleBatchError(f"Injector {producer!r} is at batch {prev.batch}, past {batch}", got=batch,
                                      hint="resume from the checkpoint the store returns")
            wm = max(watermark, prev.output_watermark) if prev else watermark
            with self._together():  # on PostgreSQL one statement of four writes (a round trip each before)
                self._insert_segments(encoded)
                self._write("INSERT INTO checkpoints VALUES (?, ?) ON CONFLICT(producer) DO UPDATE SET "
                            "position = excluded.position", (producer, checkpoint))
                self._journal(producer, batch, wm, wm, routing)  # last: its completed_at is the nearest to the commit

    def _encode_segments(self, producer: str, batch: int, slot: int, records: Mapping[str, Sequence[Production]],
                         schemas: Mapping[str, StreamSchema], routing: Routing | None) -> EncodedSegments:
        """Each stream's segment, and the routed segments of ``routing`` (rows index each stream's
        records), encoded before the transaction that inserts them (``_insert_segments``): pickling
        and Arrow's encoding take most of a small batch's writing, and SQLite's one write lock (a
        PostgreSQL writer's row locks) would be held meanwhile, stalling every other writer."""
        limit = self.segment_limit
        tables = {stream: segment_table(ps, schemas.get(stream)) for stream, ps in records.items() if ps}
        segments = [(stream, producer, batch, slot + i * PIECE_SLOT, n, data) for stream, t in tables.items()
                    for i, (n, data) in enumerate(pieces(t, limit))]
        routes = [(r.consumer, r.dest, producer, batch, r.stream, slot + i * PIECE_SLOT, n, data)
                  for r in (routing.routes if routing is not None else ()) if r.stream in tables
                  for i, (n, data) in enumerate(pieces(routed_table(tables[r.stream], r.rows, r.keys, r.errors),
                                                       limit))]
        return EncodedSegments(segments, routes)

    def _insert_segments(self, encoded: EncodedSegments) -> None:
        """Inside the transaction; stamps ``created_at`` (what retention's window counts from) there."""
        now = self.now()
        self._xmany("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(stream, producer, batch, shard) "
                    "DO UPDATE SET count = excluded.count, data = excluded.data, created_at = excluded.created_at",
                    [(*row, now) for row in encoded.segments])
        self._xmany("INSERT INTO routes VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(consumer, dest, producer, batch, "
                    "stream, slot) DO UPDATE SET count = excluded.count, data = excluded.data", encoded.routes)

    def read_routes(self, consumer: str, ranges: Sequence[tuple[str, int, int]],
                    dests: Sequence[int] | None = None) -> Iterator[RoutedSegment]:
        """``consumer``'s routed segments in the batches (after, upto] of each ``(producer, after,
        upto)``, of every interval or of ``dests``, in one query, per producer in batch order."""
        if not ranges:
            return
        ahead = self._ahead.pop(_request_key(RouteRequest(consumer, ranges, dests)), None) if self._ahead else None
        if ahead is not None:
            yield from ahead
            return
        table, param = self._ranges(list(ranges))
        condition = "r.consumer = ? AND r.producer = p AND r.batch > lo AND r.batch <= hi"
        params: list[Any] = [param, consumer]
        if dests is not None:
            dest_in, dests_param = self._in_list("r.dest", sorted(set(dests)))
            condition += f" AND {dest_in}"
            params.append(dests_param)
        sql = (f"SELECT r.producer, r.batch, r.stream, r.dest, r.data FROM {self._per_range(table, 'routes r', condition)}"
               " ORDER BY r.producer, r.batch, r.slot, r.stream, r.dest")
        for producer, batch, stream, dest, data in self._all(sql, params):
            yield RoutedSegment(str(producer), int(batch), str(stream), int(dest), segment_columns(data))

    def read_routes_ahead(self, requests: Sequence[RouteRequest]) -> None:
        """The routed segments of several ``read_routes`` calls (a worker's pass: one per
        computation with new input), read in one statement; each of those calls that follows,
        with the same arguments, is served from it, once. What a call before did not take is
        dropped; a single call is left to ``read_routes``."""
        self._ahead = {}
        if len(requests) < 2:
            return
        rows = [(i, r.consumer, p, lo, hi, None if r.dests is None else sorted(set(r.dests)))
                for i, r in enumerate(requests) for p, lo, hi in r.ranges]
        table, param = self._records("i int, c text, p text, lo bigint, hi bigint, d bigint[]", rows)
        condition = (f"r.consumer = c AND r.producer = p AND r.batch > lo AND r.batch <= hi "
                     f"AND (d IS NULL OR {self._in_row_list('r.dest', 'd')})")
        read: dict[int, list[RoutedSegment]] = {i: [] for i in range(len(requests))}
        for i, producer, batch, stream, dest, data in self._all(
                f"SELECT i, r.producer, r.batch, r.stream, r.dest, r.data FROM "
                f"{self._per_range(table, 'routes r', condition)} ORDER BY i, r.producer, r.batch, r.slot, r.stream, "
                "r.dest", (param,)):
            read[int(i)].append(RoutedSegment(str(producer), int(batch), str(stream), int(dest), segment_columns(data)))
        self._ahead = {_request_key(r): read[i] for i, r in enumerate(requests)}

    def read_segments(self, stream: str, producer: str, after_batch: int,
                      upto_batch: int) -> Iterator[tuple[int, StoredRecord]]:
        for batch, seg in self.read_segment_columns(stream, producer, after_batch, upto_batch):
            for r in zip(seg.keys, seg.values, seg.timestamps, seg.ids):
                yield batch, StoredRecord(*r)

    def read_segment_columns(self, stream: str, producer: str, after_batch: int,
                             upto_batch: int) -> Iterator[tuple[int, SegmentColumns]]:
        for batch, _shard, data in self.segment_blobs(stream, producer, after_batch, upto_batch):
            yield batch, segment_columns(data)

    def segment_blobs(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> list[tuple[int, int, bytes]]:
        """Raw segments (batch, shard, Arrow IPC bytes) of ``producer`` on ``stream`` in (after, upto]."""
        return self._all(
            "SELECT batch, shard, data FROM segments WHERE stream = ? AND producer = ? AND batch > ? AND batch <= ? "
            "ORDER BY batch, shard", (stream, producer, after_batch, upto_batch))

    def segment_records(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> int:
        """How many records ``producer``'s segments on ``stream`` in (after, upto] hold."""
        row = self._one("SELECT SUM(count) FROM segments WHERE stream = ? AND producer = ? AND batch > ? AND batch <= ?",
                        (stream, producer, after_batch, upto_batch))
        return int(row[0] or 0)

    def trim_segments(self, older_than_ms: int) -> int:
        """Retention: delete segments committed before ``older_than_ms``; returns how many went."""
        return int(self._x("DELETE FROM segments WHERE created_at < ?", (older_than_ms,)).rowcount)

    def checkpoint(self, producer: str) -> str | None:
        row = self._one("SELECT position FROM checkpoints WHERE producer = ?", (producer,))
        return row[0] if row else None
