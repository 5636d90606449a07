"""The data that crosses the engine boundary: one shard's input for a batch, and its outcome."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import eq
from typing import Any, Container, Mapping, NamedTuple, Sequence

from .seen import SeenRange

__all__ = ["shard_of", "shards_of", "InputRecord", "CheckedRecord", "Partial", "Production", "Produced", "produced", "DueTimer", "QuietReport", "Routed", "Routing", "ShardBatch",
           "ShardSnapshot", "ShardCommit"]


def shard_of(key: str, shards: int) -> int:
    """The key shard (MillWheel's key interval) a key belongs to; stable across processes."""
    return zlib.crc32(key.encode()) % shards


def shards_of(keys: Sequence[str | None], shards: int, known: dict[str, int]) -> list[int | None]:
    """``shard_of`` of many keys (None for a None key), each distinct key's computed once into
    ``known``, a cache the caller keeps across calls."""
    try:  # the common case once the cache is warm: every key known, one C-speed pass
        return list(map(known.__getitem__, keys))  # type: ignore[arg-type]
    except KeyError:
        pass
    for key in set(keys).difference(known):
        if key is not None:
            known[key] = shard_of(key, shards)
    return list(map(known.get, keys))  # type: ignore[arg-type]


class InputRecord(NamedTuple):
    """A record on its way into a computation; ``key`` is already the consumer's key."""

    stream: str
    key: str
    value: Any
    timestamp: int
    id: str


class CheckedRecord(InputRecord):
    """An ``InputRecord`` of a typed stream whose value its writer already checked against the
    schema the reader checks (its segment kept the fields as columns): not checked again."""

    __slots__ = ()


class Partial(NamedTuple):
    """A monoid computation's partial aggregate of ``records`` records of one key and window,
    folded where the records were read (docs/architecture.md §3.13)."""

    key: str
    window: int
    aggregate: Any
    records: int


class Production(NamedTuple):
    """A record a computation produced; ``key`` is the producer's hint (consumers choose their own)."""

    stream: str
    key: str | None
    value: Any
    timestamp: int
    id: str


class Produced(Production):
    """A ``Production`` from ``ctx.produce``, which pickled its value to check it: ``raw`` keeps
    those bytes for the segment writer (not pickled twice). It equals the plain ``Production``."""

    raw: bytes


def produced(stream: str, key: str | None, value: Any, timestamp: int, id: str, raw: bytes) -> Produced:
    p = _new(Produced, (stream, key, value, timestamp, id))
    p.raw = raw
    return p


_new = tuple.__new__


class Routed(NamedTuple):
    """The records of one stream that go to one consumer interval: their rows among the batch's
    records of the stream, each one's key for the consumer, and, for a record whose key could not
    be extracted (sent to interval 0), why (None elsewhere)."""

    stream: str
    consumer: str
    dest: int
    rows: list[int]
    keys: list[str | None]
    errors: list[str | None] | None


class Routing(NamedTuple):
    """What a producer's batch carries about keyed delivery: its plan, the first batch of this
    producer known to follow that plan, and its routed segments."""

    plan: str
    since: int
    routes: list[Routed]


class QuietReport(NamedTuple):
    """A continuous worker's report, once a pass, of the intervals it holds under ``sequencer`` that
    had nothing of their own to commit: they have read up to ``positions``, and stand at these
    watermarks (``IntervalStore.report_quiet``)."""

    computation: str
    sequencer: int
    positions: Mapping[str, int]
    input_watermark: int
    output_watermark: int


class DueTimer(NamedTuple):
    key: str
    tag: str
    domain: str
    timestamp: int


@dataclass(frozen=True)
class ShardBatch:
    """What one shard processes in batch ``batch`` of computation ``computation``.

    ``watermark_before`` is the input low watermark records are judged late against;
    ``watermark_after`` is the input low watermark once this batch's records are in (timers due
    at or below it fire after every record of the batch). ``dedup_streams`` names the input
    streams whose record ids must be checked against ids already seen. ``rejected`` holds input
    that could not be keyed or decoded; its value describes the error, for the dead-letter stream.
    """

    computation: str
    shard: int
    batch: int
    records: list[InputRecord]
    watermark_before: int
    watermark_after: int
    wall_clock: int
    sequencer: int
    dedup_streams: frozenset[str] = frozenset()
    rejected: list[InputRecord] = field(default_factory=list)  # bad input for the dead-letter stream
    positions: dict[str, int] | None = None  # continuous mode: the input read through, per producer
    journal_as: str | None = None  # continuous mode: the interval's producer name on the bus
    partials: list[Partial] = field(default_factory=list)  # monoid computations: records folded before the shard


@dataclass
class ShardSnapshot:
    """What the store holds for one shard at the start of a batch."""

    version: int
    states: dict[str, bytes]
    due_timers: list[DueTimer]
    output_watermark: int
    sequencer: int = 0  # the shard row's writer when read (a continuous worker's state cache checks it)


@dataclass
class ShardCommit:
    """One shard's whole outcome for one batch: written in one transaction, or not at all."""

    computation: str
    shard: int
    batch: int
    base_version: int
    sequencer: int
    state_writes: list[tuple[str, bytes | None]] = field(default_factory=list)
    timer_sets: list[DueTimer] = field(default_factory=list)
    timer_deletes: list[tuple[str, str]] = field(default_factory=list)
    seen_ids: list[tuple[str, int]] = field(default_factory=list)  # ids kept exactly (engine/seen.py)
    seen_ranges: list[SeenRange] = field(default_factory=list)  # positional ids, a range per prefix
    forget_ids_before: int | None = None
    productions: list[Production] = field(default_factory=list)
    input_watermark: int = 0
    output_watermark: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    strong_productions: bool = True
    exactly_once: bool = True  # conditional on the shard's version (exactly-once or at-most-once state)
    productions_after_state: bool = False  # at-most-once output: written once the state commit is made
    positions: dict[str, int] | None = None
    journal_as: str | None = None
    # monoid computations: (key, window, encoded partial) rows added under this batch, and the
    # (key, window) pairs whose rows of earlier batches go (emitted, or compacted into a new row)
    partial_writes: list[tuple[str, int, bytes]] = field(default_factory=list)
    partial_deletes: list[tuple[str, int]] = field(default_factory=list)
    routing: Routing | None = None  # keyed delivery: the productions' routed segments and the plan

    @property
    def producer(self) -> str:
        """Who the productions are written as on the bus: the computation, or one of its intervals."""
        return self.journal_as or self.computation


def rows_by_shard(sids: Sequence[int | None], shards: Container[int] | None) -> dict[int, list[int]]:
    """The rows of each interval (of ``shards``), in order: a C-speed pass per interval when few."""
    if shards is not None and isinstance(shards, (set, frozenset)) and len(shards) <= 8:
        return {s: rows for s in shards if (rows := list(compress(range(len(sids)), map(eq, sids, repeat(s)))))}
    out: dict[int, list[int]] = {}
    for i, s in enumerate(sids):
        if s is not None and (shards is None or s in shards):
            out.setdefault(s, []).append(i)
    return out
