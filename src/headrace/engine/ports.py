"""The ports the engine needs, declared by the engine and implemented by the stores.

The engine imports nothing from ``headrace.store``: a store is anything with these methods
(``SQLiteStore`` and ``PostgresStore`` implement all three, and pass the same conformance tests).

- ``ShardStore``: per-key state, timers and seen ids of one computation's shards, the shard's
  version, and one shard's batch outcome committed in one transaction (docs/architecture.md §2.2).
- ``Bus``: streams as segments, one per producer, stream, batch and shard (§3.7).
- ``Journal``: completed batches of every producer with their low watermarks (§2.4).
- ``IntervalStore``: all three, plus leases on key intervals, for continuous mode (§4.2).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Protocol, Sequence

from ..errors import StoreError
from .batch import DueTimer, Production, QuietReport, Routing, ShardCommit, ShardSnapshot
from .seen import SeenRange

__all__ = ["ShardStore", "Bus", "Journal", "IntervalStore", "BatchInfo", "Head", "StoredRecord", "SegmentColumns",
           "RoutedSegment", "IntervalClaim", "Fence"]


class BatchInfo(NamedTuple):
    """A completed batch of a producer (a computation, or ``inject:<stream>``) in the journal."""

    producer: str
    batch: int
    input_watermark: int
    output_watermark: int
    completed_at: int


class Head(NamedTuple):
    """Where a producer's journal stands: its last batch, the output watermark a consumer that has
    read it may take, and the routing plan that batch followed, which every batch of the producer
    from ``plan_since`` on followed too (None: not known)."""

    batch: int
    output_watermark: int
    plan: str | None = None
    plan_since: int | None = None


class StoredRecord(NamedTuple):
    """A record as the bus holds it; ``key`` is the producer's hint (``None`` when it gave none)."""

    key: str | None
    value: Any
    timestamp: int
    id: str


class SegmentColumns(Protocol):
    """One segment's records as columns (``StoredRecord``'s fields, a list each). ``keys``,
    ``ids`` and ``values`` are read on first use (values unpickled), or only at some rows
    (``values_at``). A typed stream's segment may keep its values' fields as columns too
    (``fields_schema``, the fingerprint of the schema they were written with): ``field`` reads
    one without unpickling any value."""

    fields_schema: str | None

    @property
    def timestamps(self) -> list[int]: ...

    @property
    def keys(self) -> list[str | None]: ...

    @property
    def ids(self) -> list[str]: ...

    @property
    def values(self) -> list[Any]: ...

    @property
    def raw_values(self) -> list[bytes]:
        """The values as stored (pickled), undecoded."""
        ...

    @property
    def errors(self) -> list[str | None] | None:
        """A routed segment's reasons its records have no key (None where one has); None: all have."""
        ...

    def values_at(self, rows: Sequence[int]) -> list[Any]: ...

    def field(self, name: str, kind: type) -> list[Any] | None:
        """Field ``name`` of every value, exactly as in the value, when the segment kept field
        columns and the field holds a ``kind`` (``int`` or ``str``) in every value; else None."""
        ...

    def key_field(self, name: str, kind: type) -> list[str] | None:
        """Field ``name`` of every value as ``key_by(name, kind)`` keys it (an int as its decimal
        text), read from the field columns; None when ``field(name, kind)`` would be."""
        ...

    def field_shards(self, name: str, kind: type, shards: int) -> list[int | None] | None:
        """``shard_of`` of each ``key_field(name, kind)`` key among ``shards`` intervals, computed
        over the column at once; None when ``key_field`` would be."""
        ...

    def key_shards(self, shards: int) -> list[int | None]:
        """``shard_of`` of each record's stored key (``keys``) at once; None where it has none."""
        ...

    def field_totals(self, key: str, part: str | None, window: int | None,
                     since: int) -> dict[tuple[str, int], tuple[int, int]] | None:
        """Per (field ``key``, end of the record's tumbling ``window``, or END_OF_TIME when None):
        the sum of int field ``part`` (0 when None) and the number of records; None, and the
        caller folds ``field``'s lists instead, unless every record is at or after ``since``."""
        ...


class RoutedSegment(NamedTuple):
    """A routed segment (``engine/routing.py``): one producer batch's records of one stream for one
    consumer interval, ``seg.keys`` being the consumer's keys."""

    producer: str
    batch: int
    stream: str
    dest: int
    seg: SegmentColumns


class RouteRequest(NamedTuple):
    """The arguments of one ``read_routes`` call."""

    consumer: str
    ranges: Sequence[tuple[str, int, int]]
    dests: Sequence[int] | None


class ShardStore(Protocol):
    """State, timers, seen ids and versions of key shards; the atomic commit of one shard's batch."""

    url: str

    def load_shard(self, computation: str, shard: int, keys: list[str], watermark: int,
                   wall_clock: int, tags: Sequence[str] = ()) -> ShardSnapshot: ...

    def quiet_snapshots(self, wanted: Sequence[tuple[str, int, int]],
                        wall_clock: int) -> dict[tuple[str, int], ShardSnapshot]:
        """``load_shard`` with no keys of each (computation, shard, watermark) with no due timer,
        in one round trip."""
        ...

    def load_partials(self, computation: str, shard: int,
                      windows: list[tuple[str, int]] | None) -> dict[tuple[str, int], list[bytes]]:
        """A monoid computation's delta rows of these (key, window) pairs, or of every pair of the shard."""
        ...

    def seen_ids(self, computation: str, shard: int, ids: list[str]) -> set[str]:
        """Which of these ids the shard keeps exactly (not in its ranges)."""
        ...

    def exact_seen_ids(self, computation: str, shard: int) -> Iterable[str]: ...

    def seen_ranges(self, computation: str, shard: int, prefix: str, low: int, high: int) -> list[SeenRange]:
        """The shard's ranges of ids under ``prefix`` that overlap ``[low, high]`` (engine/seen.py)."""
        ...

    def seen_range_extents(self, computation: str, shard: int) -> Iterable[tuple[str, int, int, int]]:
        """(prefix, low, high, newest) of each of the shard's ranges."""
        ...

    def all_seen_ids(self, computation: str, shard: int) -> Iterable[str]:
        """Every id the shard has seen, exact or in a range."""
        ...

    def commit_shard(self, commit: ShardCommit) -> None: ...

    def committed_productions(self, computation: str, shard: int, batch: int) -> list[Production]: ...

    def shards_with_due_timers(self, computation: str, watermark: int, wall_clock: int) -> list[int]: ...

    def due_timer_shards(self, wanted: Sequence[tuple[str, int]], wall_clock: int) -> list[list[int]]:
        """``shards_with_due_timers`` of each (computation, watermark), in one round trip."""
        ...

    def next_wall_timer(self, computation: str, shards: list[int] | None = None) -> int | None: ...

    def timers(self, computation: str, key: str) -> list[DueTimer]: ...


class Bus(Protocol):
    """Streams: segments committed by producers, readable by any consumer at its own pace."""

    def publish(self, producer: str, batch: int, records: dict[str, list[Production]], watermark: int,
                checkpoint: str | None = None, schemas: Mapping[str, Any] | None = None,
                routing: Routing | None = None) -> None:
        """An injector's batch; ``schemas`` (``StreamSchema`` by stream) lets a typed stream's
        segments keep their fields as columns; ``routing`` adds its routed segments."""
        ...

    def register_plan(self, plan: str, routes: Mapping[str, Mapping[str, Any]]) -> None: ...

    def plan_routes(self, plan: str) -> dict[str, dict[str, list[Any]]] | None:
        """A routing plan's ``{stream: {consumer: [intervals, extractor fingerprint]}}``."""
        ...

    def batch_plans(self, producer: str, after: int, upto: int) -> list[tuple[int, str | None]]: ...

    def read_routes(self, consumer: str, ranges: Sequence[tuple[str, int, int]],
                    dests: Sequence[int] | None = None) -> Iterator[RoutedSegment]: ...

    def read_routes_ahead(self, requests: Sequence[RouteRequest]) -> None:
        """The routed segments of several ``read_routes`` calls, read in one statement: each of
        them that follows, with the same arguments, is served from it (once)."""
        ...

    def check_replay(self, stream: str, producer: str, after: int) -> None:
        """Refuse to read ``producer``'s batches of ``stream`` after ``after`` when retention
        forgot some of them (an error that names the window)."""
        ...

    def segment_blobs(self, stream: str, producer: str, after_batch: int,
                      upto_batch: int) -> list[tuple[int, int, bytes]]: ...

    def read_segments(self, stream: str, producer: str, after_batch: int,
                      upto_batch: int) -> Iterator[tuple[int, StoredRecord]]: ...

    def read_segment_columns(self, stream: str, producer: str, after_batch: int,
                             upto_batch: int) -> Iterator[tuple[int, SegmentColumns]]:
        """``read_segments`` a segment at a time, as columns: what a reader of many records loops over."""
        ...

    def stream_producers(self, stream: str) -> list[str]: ...


class Journal(Protocol):
    """The watermark journal: each producer's completed batches, monotonic."""

    def complete_batch(self, producer: str, batch: int, input_watermark: int, output_watermark: int,
                       sequencer: int | None = None, routing: Routing | None = None) -> int: ...

    def batches(self, producer: str, after: int = 0) -> list[BatchInfo]: ...

    def latest_batch(self, producer: str) -> BatchInfo | None: ...

    def batch_info(self, producer: str, batch: int) -> BatchInfo | None: ...


# Where each interval of an earlier layout of a computation had read up to, when it was rescaled:
# (its shard count, {old interval: {producer: last batch read}}).
Fence = tuple[int, dict[int, dict[str, int]]]


class IntervalClaim(NamedTuple):
    """An interval a worker took: its new sequencer, and where its committed state stands.

    ``shards`` is the computation's interval count in the store (a worker planned for another
    count belongs to an older layout). A record of producer ``p`` in batch ``b`` whose key was in
    old interval ``i`` of a fence ``(n, at)`` was already taken by that interval when
    ``b <= at[i][p]`` (``i = shard_of(key, n)``): a rescaled interval skips it. ``timed``: the
    interval holds a timer (its owner sets any others in its own commits)."""

    sequencer: int
    version: int
    input_watermark: int
    positions: dict[str, int]
    shards: int = 0
    fences: tuple[Fence, ...] = ()
    timed: bool = False


class IntervalStore(ShardStore, Bus, Journal, Protocol):
    """Leases on key intervals (MillWheel §7.1: each interval is owned by one process, and its writes carry a sequencer, §6.2): each has one owner at a time, and taking one
    renews its sequencer, so the previous owner's commits are refused from then on."""

    def claim_intervals(self, computation: str, shards: list[int], owner: str, now: int,
                        lease_until: int) -> dict[int, IntervalClaim]:
        """Take those of ``shards`` nobody else holds a live lease on (one new sequencer fences
        every earlier owner of each); the ones taken, with where their committed state stands."""
        ...

    def renew_leases(self, owner: str, lease_until: int) -> dict[tuple[str, int], int]:
        """Extend every lease ``owner`` holds (one statement); each kept interval's sequencer."""
        ...

    def claimable(self, computations: list[str], owner: str, now: int) -> dict[str, list[int]]:
        """Per computation, the intervals nobody holds a live lease on (one statement)."""
        ...

    def release_intervals(self, computation: str, sequencers: dict[int, int]) -> None: ...

    def commit_shards(self, commits: list[ShardCommit], quiet: Sequence[QuietReport] = ()) -> list[StoreError | None]:
        """Several intervals' outcomes in one transaction, with the pass's reports of its quiet
        intervals; a refused one (fenced, stale) is left out and its error returned in its place."""
        ...

    def latest_batches(self, producers: list[str]) -> dict[str, int]: ...

    def producer_heads(self, producers: list[str]) -> dict[str, Head]:
        """Each producer's journal head (``Head``), in one round trip or two."""
        ...

    def report_quiet(self, reports: Sequence[QuietReport]) -> None:
        """Per report, the intervals held under its sequencer that committed nothing since are at
        its positions and watermarks (one statement for all of them)."""
        ...

    def wait_for_commits(self, channels: Sequence[str], timeout_s: float) -> bool:
        """Sleep until a producer of ``channels`` commits (or something may have), or ``timeout_s``."""
        ...
