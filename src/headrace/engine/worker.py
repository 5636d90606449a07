"""Continuous mode's worker loop (docs/architecture.md §4.2): a long-lived process that owns key
intervals under leases and runs the one batch path for an interval as soon as it has new input,
a due timer or a watermark that moved. The batches of one pass over its intervals commit
together, in one transaction: under load that is one write-lock wait and one commit for many
intervals, and when idle a pass has one batch and commits it at once.

An interval of computation ``C`` publishes on the bus as producer ``C/<interval>``: each of its
commits is a batch of that producer, journaled with the interval's watermarks in the same
transaction as its state, timers, productions, dedup ids and input positions. A consumer reads
every part of every producer it subscribes to, keys each record, and keeps the ones of the
intervals it owns; its input low watermark is the minimum, over those parts, of the watermark
journaled with the last batch it has read, so data and watermark come from one committed point.
"""

from __future__ import annotations

import time
import zlib
from itertools import compress, repeat
from operator import eq
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from ..errors import MISSING_MODULE_HINT, BadInputError, FencedWriterError, StaleBatchError, StoreError
from ..model import BEGINNING_OF_TIME, END_OF_TIME, Computation, ComputationOptions, KeyExtractor, MonoidComputation
from .batch import CheckedRecord, InputRecord, ShardBatch, shard_of, shards_of
from .monoid import Folder, columnar_parts, columnar_totals, fold_streams
from .ports import Fence, IntervalClaim, IntervalStore, SegmentColumns, StoredRecord
from .runner import DedupCache, PreparedBatch, ShardResult, commit_together, prepare_shard_batch
from .shard import ValueCheck
from .watermark import input_low_watermark

T = TypeVar("T")

__all__ = ["IntervalPlan", "Worker", "interval_producer", "wall_clock_ms"]


def interval_producer(computation: str, interval: int) -> str:
    """The bus producer name of one key interval of a computation in continuous mode."""
    return f"{computation}/{interval}"


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class IntervalPlan:
    """What a worker needs to run one computation: its code, options and subscriptions
    (stream -> the producers that write it, and the consumer's key extractor)."""

    name: str
    cls: type[Computation]
    options: ComputationOptions
    outputs: frozenset[str]
    inputs: Mapping[str, KeyExtractor]
    producers: Mapping[str, tuple[str, ...]]
    dedup_streams: frozenset[str] = frozenset()
    schemas: Mapping[str, ValueCheck] = field(default_factory=dict)  # typed streams it checks (Topology.checked_schemas)
    # intervals of an upstream's earlier, larger layout: read to their end, and then, with nothing
    # more to come from them, left out of the input watermark (the upstream's new intervals hold it)
    retired: frozenset[str] = frozenset()

    @property
    def fold_streams(self) -> frozenset[str]:
        return fold_streams(self.inputs, self.dedup_streams)

    @property
    def all_producers(self) -> list[str]:
        return sorted({p for ps in self.producers.values() for p in ps})


@dataclass
class OwnedInterval:
    """Soft state of an interval this worker owns; valid for as long as its lease."""

    shard: int
    claim: IntervalClaim
    positions: dict[str, int] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.claim.version


class Worker:
    """One worker: ``run(should_stop)`` until told to stop; ``step()`` is one pass over its intervals."""

    def __init__(self, store: IntervalStore, plans: list[IntervalPlan], owner: str, slot: int, slots: int, *,
                 lease_ms: int = 3_000, poll_ms: float = 2.0, clock: Callable[[], int] = wall_clock_ms,
                 on_fenced: Callable[[str, int, Exception], None] | None = None):
        self.store, self.plans, self.owner = store, plans, owner
        self.slot, self.slots = slot, slots
        self.lease_ms, self.poll_s, self.clock = lease_ms, poll_ms / 1000, clock
        self.owned: dict[str, dict[int, OwnedInterval]] = {p.name: {} for p in plans}
        self.code = {p.name: p.cls() for p in plans}
        self.dedup = DedupCache()
        self.started = clock()
        self._leases_checked = 0
        self._watermarks: dict[tuple[str, int], int] = {}
        self.fenced: list[tuple[str, int, str]] = []  # (computation, interval, error) it lost by being fenced
        self.fences: dict[str, tuple[Fence, ...]] = {p.name: () for p in plans}
        self.on_fenced = on_fenced

    # -- leases ---------------------------------------------------------------------------------

    def _prefers(self, computation: str, shard: int) -> bool:
        return (zlib.crc32(computation.encode()) + shard) % self.slots == self.slot

    def maintain_leases(self) -> None:
        """Renew what it owns (dropping what it lost), then take its free intervals, and any
        interval whose owner has let its lease lapse (a dead or paused worker)."""
        now = self.clock()
        until = now + self.lease_ms
        for plan in self.plans:
            owned = self.owned[plan.name]
            if owned:
                kept = self.store.renew_intervals(plan.name, {s: o.claim.sequencer for s, o in owned.items()},
                                                  self.owner, until)
                for shard in set(owned) - kept:
                    del owned[shard]
            patient = now - self.started > self.lease_ms  # a new worker lets the preferred owners come first
            wanted = [s for s in range(plan.options.shards)
                      if s not in owned and (patient or self._prefers(plan.name, s))]
            claims = self.store.claim_intervals(plan.name, wanted, self.owner, now, until)
            self._check_layout(plan, claims)
            for shard, claim in claims.items():
                self.fences[plan.name] = claim.fences
                positions = {p: claim.positions.get(p, 0) for p in plan.all_producers}
                owned[shard] = OwnedInterval(shard, claim, positions)
        self._leases_checked = now

    def _check_layout(self, plan: IntervalPlan, claims: dict[int, IntervalClaim]) -> None:
        stale = next((c.shards for c in claims.values() if c.shards != plan.options.shards), None)
        if stale is None:
            return
        self.store.release_intervals(plan.name, {s: c.sequencer for s, c in claims.items()})
        raise FencedWriterError(
            f"Worker {self.owner} runs {plan.name!r} with {plan.options.shards} key intervals, but the store has "
            f"{stale}", got=plan.options.shards,
            hint="the computation was rescaled by a newer driver; this worker belongs to an older one and stops")

    def release_all(self) -> None:
        for plan in self.plans:
            owned = self.owned[plan.name]
            if owned:
                self.store.release_intervals(plan.name, {s: o.claim.sequencer for s, o in owned.items()})
            self.owned[plan.name].clear()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool]) -> None:
        try:
            while not should_stop():
                if self.clock() - self._leases_checked >= self.lease_ms // 4:
                    self.maintain_leases()
                if not self.step():
                    time.sleep(self.poll_s)
        finally:
            self.release_all()

    def step(self) -> bool:
        """One pass: every owned interval with work runs one batch, and the pass's batches commit
        together in one transaction. True if any did."""
        producers = sorted({p for plan in self.plans for p in plan.all_producers})
        heads = self.store.latest_batches(producers)
        wall = self.clock()
        ready: list[tuple[IntervalPlan, OwnedInterval, ShardBatch, PreparedBatch]] = []
        for plan in self.plans:
            owned = self.owned[plan.name]
            if not owned:
                continue
            groups: dict[tuple[tuple[str, int], ...], list[OwnedInterval]] = {}
            for interval in owned.values():
                groups.setdefault(tuple(sorted(interval.positions.items())), []).append(interval)
            for positions, intervals in groups.items():
                ready.extend(self._prepare(plan, dict(positions), intervals, heads, wall))
        if not ready:
            return False
        outcomes = commit_together(self.store, [prepared for *_, prepared in ready])
        for (plan, interval, batch, _), outcome in zip(ready, outcomes):
            if isinstance(outcome, StoreError):
                self._lose(plan, interval, outcome)
            else:
                self._advanced(interval, batch)
        return True

    def _prepare(self, plan: IntervalPlan, positions: dict[str, int], intervals: list[OwnedInterval],
                 heads: dict[str, int], wall: int) -> list[tuple[IntervalPlan, OwnedInterval, ShardBatch, PreparedBatch]]:
        target = {p: max(heads.get(p, 0), positions.get(p, 0)) for p in plan.all_producers}
        code = self.code[plan.name]
        folders = ({i.shard: Folder(code, plan.name, i.claim.input_watermark) for i in intervals}
                   if isinstance(code, MonoidComputation) else {})  # a monoid's records are folded as they are read
        records, rejected = self._read(plan, positions, target, {i.shard for i in intervals}, folders)
        watermark = min((input_low_watermark([self._watermark_at(p, target[p]) for p in producers
                                              if p not in plan.retired],
                                             plan.options.percentile(stream))
                         for stream, producers in plan.producers.items()), default=END_OF_TIME)
        due = set(self.store.shards_with_due_timers(plan.name, watermark, wall))
        ready = []
        for interval in intervals:
            before = interval.claim.input_watermark
            after = max(before, watermark)
            mine = records.get(interval.shard, [])
            folder = folders.get(interval.shard)
            partials = folder.partials() if folder is not None else []
            bad = rejected if interval.shard == 0 else []
            if not (partials or mine or bad or interval.shard in due or after != before or target != interval.positions):
                continue
            batch = ShardBatch(plan.name, interval.shard, interval.version + 1, mine, before, after, wall,
                               interval.claim.sequencer, plan.dedup_streams, bad, positions=dict(target),
                               journal_as=interval_producer(plan.name, interval.shard), partials=partials)
            try:
                prepared = prepare_shard_batch(code, plan.name, plan.options, plan.outputs, self.store, batch,
                                               self.dedup, plan.schemas)
                if isinstance(prepared, ShardResult):  # a newer owner committed this very batch: theirs now
                    raise StaleBatchError(f"Interval {interval.shard} of {plan.name!r} already has batch "
                                          f"{batch.batch}, committed by another owner", got=batch.batch,
                                          hint="this worker drops the interval and goes on")
            except (FencedWriterError, StaleBatchError) as exc:
                self._lose(plan, interval, exc)
                continue
            ready.append((plan, interval, batch, prepared))
        return ready

    def _advanced(self, interval: OwnedInterval, batch: ShardBatch) -> None:
        interval.claim = interval.claim._replace(version=batch.batch, input_watermark=batch.watermark_after)
        interval.positions = dict(batch.positions or {})

    def _lose(self, plan: IntervalPlan, interval: OwnedInterval, exc: Exception) -> None:
        """Another worker owns the interval now: its writes win, this one drops it."""
        self.owned[plan.name].pop(interval.shard, None)
        self.fenced.append((plan.name, interval.shard, type(exc).__name__))
        if self.on_fenced is not None:
            self.on_fenced(plan.name, interval.shard, exc)

    def _watermark_at(self, producer: str, batch: int) -> int:
        """The output watermark ``producer`` journaled with ``batch`` (immutable once journaled)."""
        if batch == 0:
            return BEGINNING_OF_TIME
        key = (producer, batch)
        mark = self._watermarks.get(key)
        if mark is None:
            info = self.store.batch_info(producer, batch)
            mark = info.output_watermark if info is not None else BEGINNING_OF_TIME
            if len(self._watermarks) > 10_000:
                self._watermarks.clear()
            self._watermarks[key] = mark
        return mark

    def _read(self, plan: IntervalPlan, positions: dict[str, int], target: dict[str, int], shards: set[int],
              folders: dict[int, Folder]) -> tuple[dict[int, list[InputRecord]], list[InputRecord]]:
        """New records of every subscription, keyed for ``plan``; only those of ``shards`` are kept,
        and of those, the ones a shard's folder takes (a monoid's) are folded instead."""
        by_shard: dict[int, list[InputRecord]] = {}
        rejected: list[InputRecord] = []
        n = plan.options.shards
        fold = plan.fold_streams
        fences = self.fences[plan.name]
        shard_ids: dict[str, int] = {}
        for stream, producers in plan.producers.items():
            extractor = plan.inputs[stream]
            stream_folders = folders if stream in fold else {}
            for producer in producers:
                after, upto = positions.get(producer, 0), target[producer]
                if upto <= after:
                    continue
                for batch, seg in _segments(self.store, plan.name, stream, producer, after, upto):
                    alone = (_fold_fields(plan, stream, producer, batch, extractor, seg, shards, stream_folders,
                                          shard_ids) if stream_folders and not fences else None)
                    if alone is not None:  # folded from its field columns: only late records are left
                        for shard, records in alone.items():
                            by_shard.setdefault(shard, []).extend(records)
                        continue
                    values = _decoded(plan.name, stream, producer, batch, lambda: seg.values)
                    keyed = extractor.many(values)
                    keys: list[Any] = (  # a str each, or None for a rejected record
                        keyed if keyed is not None  # else some record has no key: find which, fail or dead-letter it
                        else self._key_each(plan, stream, extractor, producer, batch, seg, fences, rejected))
                    schema = plan.schemas.get(stream)
                    if schema is not None and seg.fields_schema == schema.fingerprint:
                        schema, make = None, CheckedRecord  # its writer checked every value against it
                    else:
                        make = InputRecord
                    stamps, ids = seg.timestamps, seg.ids
                    sids = shards_of(keys, n, shard_ids)  # None for a rejected record
                    for shard, rows in _rows_by_shard(sids, shards).items():
                        if fences:
                            rows = [i for i in rows if not _taken(fences, keys[i], producer, batch)]
                        if rows and shard in stream_folders:
                            rows = stream_folders[shard].add_many(keys, values, stamps, ids, rows, schema)
                        if rows:
                            by_shard.setdefault(shard, []).extend(
                                make(stream, keys[i], values[i], stamps[i], ids[i]) for i in rows)
        return by_shard, rejected

    def _key_each(self, plan: IntervalPlan, stream: str, extractor: KeyExtractor, producer: str, batch: int,
                  seg: SegmentColumns, fences: tuple[Fence, ...], rejected: list[InputRecord]) -> list[str | None]:
        """A segment's keys one record at a time: one without a key stops the worker, or with
        ``on_error="dead_letter"`` becomes a rejection (None in the keys)."""
        keys: list[str | None] = []
        for r in map(StoredRecord._make, zip(seg.keys, seg.values, seg.timestamps, seg.ids)):
            try:
                keys.append(extractor(r.value))
                continue
            except Exception as exc:
                cause = f"{type(exc).__name__}: {exc}"
                if plan.options.on_error != "dead_letter":
                    raise BadInputError(
                        f"Computation {plan.name!r} cannot take record {r.id!r} of stream {stream!r}: "
                        f"failed extracting its key with {extractor.description}", got_text=cause,
                        hint="fix the record or the key extractor, or add the computation with "
                             "on_error='dead_letter' to route such records aside") from None
            keys.append(None)
            if fences and any(batch <= at.get(0, {}).get(producer, 0) for _, at in fences):
                continue  # an earlier layout's interval 0, which takes bad input, took it
            rejected.append(InputRecord(stream, "", _rejection(plan.name, extractor, stream, r, cause),
                                        r.timestamp, r.id))
        return keys


def _segments(store: IntervalStore, name: str, stream: str, producer: str, after: int, upto: int) -> Any:
    """The segments of ``producer`` on ``stream`` in batches (after, upto]; one that cannot be
    decoded stops the worker with an error that names it (retrying could never get past it)."""
    try:
        yield from store.read_segment_columns(stream, producer, after, upto)
    except Exception as exc:
        raise _undecodable(name, stream, producer, f"in its batches {after + 1}..{upto}", exc) from None


def _decoded(name: str, stream: str, producer: str, batch: int, decode: Callable[[], T]) -> T:
    """``decode()`` (a segment's values, unpickled when first asked for), failing as ``_segments`` does."""
    try:
        return decode()
    except Exception as exc:
        raise _undecodable(name, stream, producer, f"in its batch {batch}", exc) from None


def _undecodable(name: str, stream: str, producer: str, where: str, exc: Exception) -> BadInputError:
    return BadInputError(
        f"Computation {name!r} cannot decode a record of stream {stream!r} written by {producer!r} {where}",
        got_text=f"{type(exc).__name__}: {exc}",
        hint=MISSING_MODULE_HINT if isinstance(exc, ImportError) else
        "a value this worker cannot unpickle: install on the workers the modules its classes come from")


def _fold_fields(plan: IntervalPlan, stream: str, producer: str, batch: int, extractor: KeyExtractor,
                 seg: SegmentColumns, shards: set[int], folders: dict[int, Folder],
                 shard_ids: dict[str, int]) -> dict[int, list[InputRecord]] | None:
    """A typed stream's segment folded from its field columns (summed by the store's columns,
    ``columnar_totals``, or ``columnar_parts``' lists when some record may be late for one of
    ``shards``); returns the records that travel alone (late ones) by shard, or None: the segment
    takes the per-record path."""
    first, schema = next(iter(folders.values())), plan.schemas.get(stream)
    since = max((folders[s].before for s in shards), default=None)
    totals = columnar_totals(first, extractor, seg, schema, since) if since is not None else None
    if totals is not None:
        mine: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
        for (slot, summed), shard in zip(totals.items(), shards_of([k for k, _ in totals], plan.options.shards,
                                                                     shard_ids)):
            if shard in shards:
                mine.setdefault(shard, {})[slot] = summed
        for shard, owned in mine.items():
            folders[shard].add_totals(owned)
        return {}
    columns = columnar_parts(first, extractor, seg, schema)
    if columns is None:
        return None
    keys, parts = columns
    out: dict[int, list[InputRecord]] = {}
    for shard, rows in _rows_by_shard(shards_of(keys, plan.options.shards, shard_ids), shards).items():
        late = folders[shard].add_columns(keys, parts, seg.timestamps, rows) if rows else []
        if late:
            out[shard] = [CheckedRecord(stream, keys[i], value, seg.timestamps[i], seg.ids[i])
                          for i, value in zip(late, _decoded(plan.name, stream, producer, batch,
                                                             lambda: seg.values_at(late)))]
    return out


def _rows_by_shard(sids: list[int | None], shards: set[int]) -> dict[int, list[int]]:
    """The rows of each of ``shards``, in order: a C-speed pass per shard when a worker owns few."""
    if len(shards) <= 8:
        return {s: list(compress(range(len(sids)), map(eq, sids, repeat(s)))) for s in shards}
    out: dict[int, list[int]] = {}
    for i, s in enumerate(sids):
        if s is not None and s in shards:
            out.setdefault(s, []).append(i)
    return out


def _taken(fences: tuple[Fence, ...], key: str, producer: str, batch: int) -> bool:
    """Whether an interval of an earlier layout already took this record for its key."""
    return any(batch <= at.get(shard_of(key, n), {}).get(producer, 0) for n, at in fences)


def _rejection(name: str, extractor: KeyExtractor, stream: str, record: Any, cause: str) -> dict[str, Any]:
    return {"computation": name, "key": None, "at": f"failed extracting its key with {extractor.description}",
            "stream": stream, "record_id": record.id, "value": record.value, "error": cause}
