"""Continuous mode's worker loop (docs/architecture.md §4.2): a long-lived process that owns key
intervals under leases and runs the one batch path for an interval as soon as it has records of
its own or a due timer. The batches of one pass over its intervals commit together, in one
transaction: under load that is one write-lock wait and one commit for many intervals.

An interval reads only its own records: its producers routed them to it (keyed delivery,
``engine/routing.py``), and ``engine/intake.py`` reads them. An interval with nothing of its own
and no due timer commits nothing: once a pass, the worker reports all such intervals' new
positions and watermarks in one statement (``report_quiet``), so a pass costs what its active
intervals cost, however many it owns. When no pass has work, the worker sleeps until a producer
it reads commits (``wait_for_commits``: LISTEN/NOTIFY on PostgreSQL; SQLite's data version).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import FencedWriterError, StaleBatchError, StoreError
from ..model import BEGINNING_OF_TIME, END_OF_TIME, Computation, ComputationOptions, MonoidComputation
from ..names import interval
from .batch import InputRecord, QuietReport, Routing, ShardBatch
from .intake import Consumer, input_watermark, plan_ranges, read_keyed, records_of, select
from .monoid import Folder
from .ports import Fence, Head, IntervalClaim, IntervalStore
from .routing import RoutingPlan
from .runner import DedupCache, PreparedBatch, ShardResult, commit_together, prepare_shard_batch

__all__ = ["IntervalPlan", "Worker", "wall_clock_ms"]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class IntervalPlan:
    """What a worker needs to run one computation: its read side, its code, its outputs and whom
    it routes them for."""

    consumer: Consumer
    cls: type[Computation]
    outputs: frozenset[str]
    routing: RoutingPlan

    @property
    def name(self) -> str:
        return self.consumer.name

    @property
    def options(self) -> ComputationOptions:
        return self.consumer.options


@dataclass
class OwnedInterval:
    """Soft state of an interval this worker owns; valid for as long as its lease."""

    shard: int
    claim: IntervalClaim
    positions: dict[str, int] = field(default_factory=dict)
    since: int | None = None  # its first batch committed here: every later one follows this worker's plan

    @property
    def version(self) -> int:
        return self.claim.version


class Worker:
    """One worker: ``run(should_stop)`` until told to stop; ``step()`` is one pass over its intervals."""

    def __init__(self, store: IntervalStore, plans: list[IntervalPlan], owner: str, slot: int, slots: int, *,
                 lease_ms: int = 3_000, idle_ms: float = 250.0, clock: Callable[[], int] = wall_clock_ms,
                 on_fenced: Callable[[str, int, Exception], None] | None = None, discover_ms: int = 1_000):
        self.store, self.plans, self.owner = store, plans, owner
        self.slot, self.slots = slot, slots
        self.lease_ms, self.idle_s, self.clock, self.discover_ms = lease_ms, idle_ms / 1000, clock, discover_ms
        self.owned: dict[str, dict[int, OwnedInterval]] = {p.name: {} for p in plans}
        self.code = {p.name: p.cls() for p in plans}
        self.consumers = {p.name: p.consumer for p in plans}
        self.dedup = DedupCache()
        self.started = clock()
        self._leases_checked = 0
        self._wall_due: int | None = None  # its intervals' next wall timer (None: look it up)
        self._discovered = 0
        self._marks: dict[tuple[str, int], int] = {}
        self._plans: dict[str, dict[str, dict[str, int]] | None] = {}
        self._shard_ids: dict[str, dict[str, int]] = {p.name: {} for p in plans}
        self._reported: dict[tuple[str, int], tuple[tuple[tuple[str, int], ...], int]] = {}
        self.fenced: list[tuple[str, int, str]] = []  # (computation, interval, error) it lost by being fenced
        self.fences: dict[str, tuple[Fence, ...]] = {p.name: () for p in plans}
        self.on_fenced = on_fenced
        for plan in plans:
            if plan.routing.subscribers:
                store.register_plan(plan.routing.id, plan.routing.routes)

    # -- leases ---------------------------------------------------------------------------------

    def _prefers(self, computation: str, shard: int) -> bool:
        return (zlib.crc32(computation.encode()) + shard) % self.slots == self.slot

    def maintain_leases(self) -> None:
        """Renew what it owns in one statement (dropping what it lost), then take its free intervals
        and any whose owner let its lease lapse (a dead or paused worker): one statement to find
        them, and a claim only when there are some."""
        now = self.clock()
        until = now + self.lease_ms
        held = self.store.renew_leases(self.owner, until)
        for plan in self.plans:
            owned = self.owned[plan.name]
            for shard in [s for s, o in owned.items() if held.get((plan.name, s)) != o.claim.sequencer]:
                del owned[shard]
        patient = now - self.started > self.lease_ms  # a new worker lets the preferred owners come first
        free = self.store.claimable([p.name for p in self.plans], self.owner, now)
        for plan in self.plans:
            owned = self.owned[plan.name]
            wanted = [s for s in free.get(plan.name, ())
                      if s not in owned and s < plan.options.shards and (patient or self._prefers(plan.name, s))]
            if not wanted:
                continue
            claims = self.store.claim_intervals(plan.name, wanted, self.owner, now, until)
            self._check_layout(plan, claims)
            for shard, claim in claims.items():
                self.fences[plan.name] = claim.fences
                positions = {p: claim.positions.get(p, 0) for p in self.consumers[plan.name].all_producers}
                owned[shard] = OwnedInterval(shard, claim, positions)
            if claims:
                self._wall_due = None  # their wall timers: look again
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
        """Passes while there is work; between them, sleep until a producer it reads commits, its
        leases need renewing, or one of its wall timers falls due."""
        renew_every = self.lease_ms // 3
        woken = True
        try:
            while not should_stop():
                now = self.clock()
                if now - self._leases_checked >= renew_every:
                    self.maintain_leases()
                if woken or (self._wall_due is not None and self._wall_due <= now):
                    if self.step():
                        continue
                if self._wall_due is None:  # idle from here: when does a wall timer need a pass
                    marks = [self.store.next_wall_timer(p.name, sorted(self.owned[p.name])) for p in self.plans
                             if self.owned[p.name]]
                    self._wall_due = min((m for m in marks if m is not None), default=END_OF_TIME)
                    if self._wall_due <= self.clock():
                        woken = True
                        continue
                until = min(self._leases_checked + renew_every, self._wall_due)
                wait = min(self.idle_s, max(0.0, (until - self.clock()) / 1000))
                woken = self.store.wait_for_commits(self.channels(), wait)
        finally:
            self.release_all()

    def channels(self) -> list[str]:
        """The producers whose commits wake this worker."""
        return sorted({p for c in self.consumers.values() for p in c.all_producers})

    def _discover(self) -> None:
        """Pick up injector parts declared since the plan was made (a Kafka partition added)."""
        now = self.clock()
        if now - self._discovered < self.discover_ms:
            return
        self._discovered = now
        declared: dict[str, list[str]] = {}
        for consumer in self.consumers.values():
            for stream in consumer.inputs:
                if stream not in declared:
                    declared[stream] = self.store.stream_producers(stream)
        for name, consumer in self.consumers.items():
            self.consumers[name] = consumer.with_parts(declared)

    def step(self) -> bool:
        """One pass: every owned interval with records of its own or a due timer runs one batch;
        the batches and the quiet intervals' report commit together. True if any batch ran."""
        self._discover()
        heads = self.store.producer_heads(self.channels())
        wall = self.clock()
        ready: list[tuple[IntervalPlan, OwnedInterval, ShardBatch, PreparedBatch]] = []
        quiet: list[tuple[str, int, dict[str, int], int]] = []
        for plan in self.plans:
            owned = self.owned[plan.name]
            if not owned:
                continue
            groups: dict[tuple[tuple[str, int], ...], list[OwnedInterval]] = {}
            for interval_ in owned.values():
                groups.setdefault(tuple(sorted(interval_.positions.items())), []).append(interval_)
            for positions, intervals in groups.items():
                ready.extend(self._prepare(plan, dict(positions), intervals, heads, wall, quiet))
        reports = self._reports(quiet)
        if not ready:
            for report in reports:
                self.store.report_quiet(*report)
            return False
        outcomes = commit_together(self.store, [prepared for *_, prepared in ready], reports)
        self._wall_due = None  # its commits may have set or fired wall timers
        for (plan, owned_interval, batch, _), outcome in zip(ready, outcomes):
            if isinstance(outcome, StoreError):
                self._lose(plan, owned_interval, outcome)
            else:
                self._advanced(owned_interval, batch)
        return True

    def _reports(self, quiet: list[tuple[str, int, dict[str, int], int]]) -> list[QuietReport]:
        """One report per computation and sequencer whose quiet intervals moved since the last one."""
        out = []
        for computation, sequencer, positions, watermark in quiet:
            key, state = (computation, sequencer), (tuple(sorted(positions.items())), watermark)
            if self._reported.get(key) != state:
                self._reported[key] = state
                out.append(QuietReport(computation, sequencer, positions, watermark, watermark))
        return out

    def _prepare(self, plan: IntervalPlan, positions: dict[str, int], intervals: list[OwnedInterval],
                 heads: Mapping[str, Head], wall: int, quiet: list[tuple[str, int, dict[str, int], int]],
                 ) -> list[tuple[IntervalPlan, OwnedInterval, ShardBatch, PreparedBatch]]:
        consumer = self.consumers[plan.name]
        target = {p: max(heads[p].batch if p in heads else 0, positions.get(p, 0)) for p in consumer.all_producers}
        code = self.code[plan.name]
        shards = {i.shard for i in intervals}
        folders = ({i.shard: Folder(code, plan.name, i.claim.input_watermark) for i in intervals}
                   if isinstance(code, MonoidComputation) else {})  # a monoid's records are folded as they are read
        records: dict[int, list[InputRecord]] = {}
        rejected: list[InputRecord] = []
        ranges = plan_ranges(self.store, consumer, positions, heads, self._plans)
        if ranges:
            dests = sorted(shards) if len(shards) < consumer.shards else None
            keyed = read_keyed(self.store, consumer, ranges, dests, self._shard_ids[plan.name])
            before = min((f.before for f in folders.values()), default=None)
            for picked in select(consumer, keyed, shards, self.fences[plan.name], folders.get, before):
                taken, refused = records_of(consumer, picked)
                for shard, rs in taken.items():
                    records.setdefault(shard, []).extend(rs)
                rejected.extend(refused)
        watermark = input_watermark(consumer, lambda p: self._mark_at(p, target[p], heads))
        due = set(self.store.shards_with_due_timers(plan.name, watermark, wall))
        ready = []
        for owned in intervals:
            before = owned.claim.input_watermark
            after = max(before, watermark)
            mine = records.get(owned.shard, [])
            folder = folders.get(owned.shard)
            partials = folder.partials() if folder is not None else []
            bad = rejected if owned.shard == 0 else []
            if not (partials or mine or bad or owned.shard in due):
                owned.claim = owned.claim._replace(input_watermark=after)
                owned.positions = dict(target)
                quiet.append((plan.name, owned.claim.sequencer, dict(target), watermark))
                continue
            batch = ShardBatch(plan.name, owned.shard, owned.version + 1, mine, before, after, wall,
                               owned.claim.sequencer, consumer.dedup_streams, bad, positions=dict(target),
                               journal_as=interval(plan.name, owned.shard), partials=partials)
            routing = (Routing(plan.routing.id, owned.since or batch.batch, [])
                       if plan.routing.subscribers else None)
            try:
                prepared = prepare_shard_batch(code, plan.name, plan.options, plan.outputs, self.store, batch,
                                               self.dedup, consumer.schemas, plan.routing, routing)
                if isinstance(prepared, ShardResult):  # a newer owner committed this very batch: theirs now
                    raise StaleBatchError(f"Interval {owned.shard} of {plan.name!r} already has batch "
                                          f"{batch.batch}, committed by another owner", got=batch.batch,
                                          hint="this worker drops the interval and goes on")
            except (FencedWriterError, StaleBatchError) as exc:
                self._lose(plan, owned, exc)
                continue
            ready.append((plan, owned, batch, prepared))
        return ready

    def _advanced(self, owned: OwnedInterval, batch: ShardBatch) -> None:
        owned.claim = owned.claim._replace(version=batch.batch, input_watermark=batch.watermark_after)
        owned.positions = dict(batch.positions or {})
        owned.since = owned.since or batch.batch

    def _lose(self, plan: IntervalPlan, owned: OwnedInterval, exc: Exception) -> None:
        """Another worker owns the interval now: its writes win, this one drops it."""
        self.owned[plan.name].pop(owned.shard, None)
        self.fenced.append((plan.name, owned.shard, type(exc).__name__))
        if self.on_fenced is not None:
            self.on_fenced(plan.name, owned.shard, exc)

    def _mark_at(self, producer: str, batch: int, heads: Mapping[str, Head]) -> int:
        """The output watermark ``producer`` journaled with ``batch`` (immutable once journaled; at
        its head, raised by a quiet report)."""
        head = heads.get(producer)
        if head is not None and head.batch == batch:
            return head.output_watermark
        if batch == 0:
            return BEGINNING_OF_TIME
        key = (producer, batch)
        mark = self._marks.get(key)
        if mark is None:
            info = self.store.batch_info(producer, batch)
            mark = info.output_watermark if info is not None else BEGINNING_OF_TIME
            if len(self._marks) > 10_000:
                self._marks.clear()
            self._marks[key] = mark
        return mark
