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
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

from ..errors import FencedWriterError, StaleBatchError, StoreError
from ..model import BEGINNING_OF_TIME, END_OF_TIME, Computation, ComputationOptions, MonoidComputation
from ..names import interval
from .batch import InputRecord, QuietReport, Routing, ShardBatch
from .failures import construct
from .groups import Group, Groups, OwnedInterval
from .consumer import Consumer, Range, input_watermark, plan_ranges
from .intake import gather, reader_dests, route_requests
from .monoid import Folder
from .ports import Fence, Head, IntervalClaim, IntervalStore
from .routing import RoutingPlan
from .runner import DedupCache, PreparedBatch, ShardResult, collector_paused, commit_together, prepare_shard_batch
from .statecache import StateCache

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


class GroupRead(NamedTuple):
    """What a pass read of one group of intervals (``Worker._read``)."""

    target: dict[str, int]  # the positions read up to, per producer
    watermark: int
    records: dict[int, list[InputRecord]]  # per interval
    rejected: dict[int, list[InputRecord]]  # records without a key, per interval
    folders: dict[int, Folder]  # a monoid's records folded as they were read, per interval


class Worker:
    """One worker: ``run(should_stop)`` until told to stop; ``step()`` is one pass over its intervals."""

    def __init__(self, store: IntervalStore, plans: list[IntervalPlan], owner: str, slot: int, slots: int, *,
                 lease_ms: int = 3_000, idle_ms: float = 250.0, clock: Callable[[], int] = wall_clock_ms,
                 on_fenced: Callable[[str, int, Exception], None] | None = None, discover_ms: int = 1_000,
                 on_load: Callable[[dict[str, list[int]]], None] | None = None):
        self.store, self.plans, self.owner = store, plans, owner
        self.slot, self.slots = slot, slots
        self.lease_ms, self.idle_s, self.clock, self.discover_ms = lease_ms, idle_ms / 1000, clock, discover_ms
        self.groups: dict[str, Groups] = {p.name: Groups() for p in plans}
        self.code = {p.name: construct(p.cls, p.name) for p in plans}
        self.consumers = {p.name: p.consumer for p in plans}
        self.dedup = DedupCache()
        self.state_cache = StateCache()  # hot keys' state of the intervals it holds (engine/statecache.py)
        self.started = clock()
        self._leases_checked = 0
        self.woken_by_commit = False  # whether a commit ended the last wait of ``run``
        self.idle = False  # whether the last pass of ``run`` found no work
        self._free_checked: int | None = None
        self._wall_due: int | None = None  # its intervals' next wall timer (None: look it up)
        # the computations of which an interval it holds may hold a timer: one held one when it
        # was claimed, or set one in a commit since (only an interval's owner sets its timers)
        self.timed: set[str] = set()
        self._discovered = 0
        self._marks: dict[tuple[str, int], int] = {}
        self._plans: dict[str, Any] = {}  # routing plans read, by id
        self._shard_ids: dict[str, dict[str, int]] = {p.name: {} for p in plans}
        self._reported: dict[tuple[str, int], tuple[dict[str, int], int]] = {}
        self.fenced: list[tuple[str, int, str]] = []  # (computation, interval, error) it lost by being fenced
        self.fences: dict[str, tuple[Fence, ...]] = {p.name: () for p in plans}
        self.on_fenced = on_fenced
        self.on_load = on_load  # told, once a lease round, what each interval processed since the last
        self._load: dict[str, list[Any]] = {}  # "C/i" -> [records, a few of its keys]
        for plan in plans:
            if plan.routing.subscribers:
                store.register_plan(plan.routing.id, plan.routing.routes)

    # -- leases ---------------------------------------------------------------------------------

    def _prefers(self, computation: str, shard: int) -> bool:
        return (zlib.crc32(computation.encode()) + shard) % self.slots == self.slot

    @property
    def owned(self) -> dict[str, dict[int, OwnedInterval]]:
        """The intervals it owns, by computation and interval."""
        return {name: groups.owned for name, groups in self.groups.items()}

    def maintain_leases(self) -> bool:
        """Renew what it owns in one statement (dropping what it lost), then take its free intervals
        and any whose owner let its lease lapse (a dead or paused worker): one statement to find
        them, and a claim only when there are some. True if it took any (they need a pass: to
        read what they have not, and report where they stand under their new sequencer)."""
        now = self.clock()
        until = now + self.lease_ms
        held = self.store.renew_leases(self.owner, until)
        for plan in self.plans:
            groups = self.groups[plan.name]
            for shard in [s for s, o in groups.owned.items() if held.get((plan.name, s)) != o.claim.sequencer]:
                groups.discard(shard)
                self.state_cache.drop(plan.name, shard)
        self._report_load()
        patient = now - self.started > self.lease_ms  # a new worker lets the preferred owners come first
        # what is free or lapsed, every third of a lease (a renewal alone finds what the driver moved to it)
        free: dict[str, list[int]] = {}
        if self._free_checked is None or now - self._free_checked >= self.lease_ms // 3:
            self._free_checked = now
            free = self.store.claimable([p.name for p in self.plans], self.owner, now)
        took = False
        for plan in self.plans:
            groups = self.groups[plan.name]
            # the free ones it may take, and those the driver moved to it (``reassign``: its own already)
            given = [s for (c, s) in held if c == plan.name and s not in groups.owned]
            wanted = [s for s in free.get(plan.name, ())
                      if s not in groups.owned and s < plan.options.shards and (patient or self._prefers(plan.name, s))]
            wanted = sorted({*wanted, *given})
            if not wanted:
                continue
            claims = self.store.claim_intervals(plan.name, wanted, self.owner, now, until)
            self._check_layout(plan, claims)
            producers = self.consumers[plan.name].all_producers
            for shard, claim in claims.items():
                if claim.timed:
                    self.timed.add(plan.name)
                self.fences[plan.name] = claim.fences
                self.state_cache.drop(plan.name, shard)
                groups.add(OwnedInterval(shard, claim), {p: claim.positions.get(p, 0) for p in producers})
            if claims:
                self._wall_due = None  # their wall timers: look again
                took = True
        self._leases_checked = now
        return took

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
            groups = self.groups[plan.name]
            if groups.owned:
                self.store.release_intervals(plan.name, {s: o.claim.sequencer for s, o in groups.owned.items()})
            self.groups[plan.name] = Groups()
        self.state_cache.clear()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Passes while there is work; between them, sleep until a producer it reads commits, its
        leases need renewing, or one of its wall timers falls due. ``woken_by_commit`` tells
        ``should_stop`` whether a commit woke it (a signal to stop is one), and ``idle`` whether its
        last pass found nothing to do, so it may look sooner."""
        renew_every = self.lease_ms // 6  # a lease survives five missed renewals; a moved interval waits half a second
        self.store.wait_for_commits(self.channels(), 0)  # told of commits from now on
        woken = self.woken_by_commit = True
        try:
            while not should_stop():
                self.woken_by_commit = False
                now = self.clock()
                if now - self._leases_checked >= renew_every and self.maintain_leases():
                    woken = True
                if woken or (self._wall_due is not None and self._wall_due <= now):
                    with collector_paused():
                        worked = self.step()
                    self.idle = not worked
                    if worked:
                        continue
                if self._wall_due is None:  # idle from here: when does a wall timer need a pass
                    marks = [self.store.next_wall_timer(p.name, None if len(self.groups[p.name]) == p.options.shards
                                                        else sorted(self.groups[p.name].owned))
                             for p in self.plans if len(self.groups[p.name]) and p.name in self.timed]
                    self._wall_due = min((m for m in marks if m is not None), default=END_OF_TIME)
                    if self._wall_due <= self.clock():
                        woken = True
                        continue
                until = min(self._leases_checked + renew_every, self._wall_due)
                wait = min(self.idle_s, max(0.0, (until - self.clock()) / 1000))
                woken = self.woken_by_commit = self.store.wait_for_commits(self.channels(), wait)
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
        the batches and the report of the quiet ones commit together. True if any batch ran."""
        self._discover()
        heads = self.store.producer_heads(self.channels())
        wall = self.clock()
        ready: list[tuple[IntervalPlan, Group, OwnedInterval, ShardBatch, PreparedBatch]] = []
        groups = [(plan, group) for plan in self.plans for group in self.groups[plan.name]]
        ranges = [plan_ranges(self.store, self.consumers[plan.name], group.positions, heads, self._plans)
                  for plan, group in groups]
        # every group's routed segments in one statement: a round trip per computation otherwise
        self.store.read_routes_ahead([request for (plan, group), rs in zip(groups, ranges) for request in
                                      route_requests(self.consumers[plan.name], rs,
                                                     reader_dests(self.consumers[plan.name], group.shards))])
        reads = [(plan, group, self._read(plan, group, heads, rs)) for (plan, group), rs in zip(groups, ranges)]
        due = self._due_timers(reads, wall)
        batches = [(plan, group, *b) for (plan, group, read), due_shards in zip(reads, due)
                   for b in self._batches(plan, group, read, due_shards, wall)]
        # the rows of the intervals whose state the cache serves (not a monoid's), in one read
        self.state_cache.prefetch(self.store, [(plan.name, b.shard, b.watermark_after) for plan, _, _, b, _ in batches
                                               if not isinstance(self.code[plan.name], MonoidComputation)], wall)
        for plan, group, interval_, batch, routing in batches:
            prepared = self._prepare(plan, interval_, batch, routing)
            if prepared is not None:
                ready.append((plan, group, interval_, batch, prepared))
        moved: list[tuple[IntervalPlan, Group, dict[str, int], int]] = [
            (plan, group, read.target, read.watermark) for plan, group, read in reads]
        reports = self._reports(moved)
        if not ready:
            self.store.report_quiet(reports)
            self._moved(moved)
            return False
        outcomes = commit_together(self.store, [prepared for *_, prepared in ready], reports)
        self._wall_due = None  # its commits may have set or fired wall timers
        for (plan, group, owned, batch, prepared), outcome in zip(ready, outcomes):
            if isinstance(outcome, StoreError):
                self._lose(plan, owned, outcome)
            else:
                if prepared.commit.timer_sets:
                    self.timed.add(plan.name)
                owned.claim = owned.claim._replace(version=batch.batch, input_watermark=batch.watermark_after)
                owned.since = owned.since or batch.batch
                group.top = max(group.top, batch.watermark_after)
                self._count(plan.name, owned.shard, batch)
        self._moved(moved)
        return True

    def _due_timers(self, reads: list[tuple[IntervalPlan, Group, GroupRead]], wall: int) -> list[list[int]]:
        """For each group read, the intervals of its computation with a due timer: looked up, in one
        statement, only for the computations whose intervals may hold one (``timed``)."""
        wanted = [(plan.name, read.watermark) for plan, _, read in reads if plan.name in self.timed]
        found = iter(self.store.due_timer_shards(wanted, wall) if wanted else [])
        return [next(found) if plan.name in self.timed else [] for plan, _, _ in reads]

    def _count(self, computation: str, shard: int, batch: ShardBatch) -> None:
        """What an interval processed, for the driver's rebalancing: records, and up to two keys."""
        load = self._load.setdefault(interval(computation, shard), [0, set()])
        load[0] += len(batch.records) + sum(p.records for p in batch.partials)
        keys = load[1]
        for key in (*(r.key for r in batch.records[:4]), *(p.key for p in batch.partials[:4])):
            if len(keys) >= 2:
                break
            keys.add(key)

    def _report_load(self) -> None:
        if self.on_load is not None and self._load:
            self.on_load({name: [records, len(keys)] for name, (records, keys) in self._load.items()})
        self._load = {}

    def _moved(self, moved: list[tuple[IntervalPlan, Group, dict[str, int], int]]) -> None:
        for plan, group, target, watermark in moved:
            if group.shards:
                self.groups[plan.name].moved(group, target, watermark)

    def _reports(self, moved: list[tuple[IntervalPlan, Group, dict[str, int], int]]) -> list[QuietReport]:
        """One report per computation and sequencer whose quiet intervals moved since the last one:
        every interval held under it that committed nothing since is at these positions. Where
        groups at different positions share a sequencer (a claim took intervals that stood at
        different places), the report holds what all of them reached: each producer's lowest
        position and the lowest watermark (the report's row is one per computation and sequencer)."""
        merged: dict[tuple[str, int], tuple[dict[str, int], int]] = {}
        for plan, group, target, watermark in moved:
            for sequencer in group.sequencers:
                key = (plan.name, sequencer)
                if key in merged:
                    positions, low = merged[key]
                    merged[key] = ({p: min(b, positions[p]) if p in positions else b for p, b in target.items()}
                                   | {p: b for p, b in positions.items() if p not in target}, min(low, watermark))
                else:
                    merged[key] = (dict(target), watermark)
        out = []
        for key, state in sorted(merged.items()):
            if self._reported.get(key) != state:
                self._reported[key] = state
                out.append(QuietReport(key[0], key[1], state[0], state[1], state[1]))
        return out

    def _read(self, plan: IntervalPlan, group: Group, heads: Mapping[str, Head], ranges: list[Range]) -> GroupRead:
        """A group's new input in ``ranges``, read once (its intervals' routed segments), split by
        interval, and the positions and watermark it reads up to."""
        consumer = self.consumers[plan.name]
        positions = group.positions
        target = {p: max(heads[p].batch if p in heads else 0, positions.get(p, 0)) for p in consumer.all_producers}
        code = self.code[plan.name]
        owned = self.groups[plan.name].owned
        folders: dict[int, Folder] = {}

        def folder_of(shard: int) -> Folder | None:  # a monoid's records are folded as they are read
            if not isinstance(code, MonoidComputation):
                return None
            if shard not in folders:
                folders[shard] = Folder(code, plan.name, group.before(owned[shard]))
            return folders[shard]

        top = group.top if isinstance(code, MonoidComputation) else None
        records, rejected = gather(self.store, consumer, ranges, group.shards, self._shard_ids[plan.name],
                                   self.fences[plan.name], folder_of, top) if ranges else ({}, {})
        watermark = input_watermark(consumer, lambda p: self._mark_at(p, target[p], heads))
        return GroupRead(target, watermark, records, rejected, folders)

    def _batches(self, plan: IntervalPlan, group: Group, read: GroupRead, due: list[int], wall: int,
                 ) -> list[tuple[OwnedInterval, ShardBatch, Routing | None]]:
        """A batch for each of the group's intervals that has records of its own or a due timer
        (``due``: the computation's intervals with one); the rest stay quiet."""
        consumer = self.consumers[plan.name]
        owned = self.groups[plan.name].owned
        target, watermark, records, rejected, folders = read
        out = []
        for shard in sorted({*records, *rejected, *folders, *(s for s in due if s in group.shards)}):
            interval_ = owned[shard]
            before = group.before(interval_)
            folder = folders.get(shard)
            batch = ShardBatch(plan.name, shard, interval_.version + 1, records.get(shard, []), before,
                               max(before, watermark), wall, interval_.claim.sequencer, consumer.dedup_streams,
                               rejected.get(shard, []), positions=dict(target), journal_as=interval(plan.name, shard),
                               partials=folder.partials() if folder is not None else [])
            routing = (Routing(plan.routing.id, interval_.since or batch.batch, [])
                       if plan.routing.subscribers else None)
            out.append((interval_, batch, routing))
        return out

    def _prepare(self, plan: IntervalPlan, interval_: OwnedInterval, batch: ShardBatch,
                 routing: Routing | None) -> PreparedBatch | None:
        """The interval's batch run and ready to commit; None when the interval was lost to a newer owner."""
        try:
            prepared = prepare_shard_batch(self.code[plan.name], plan.name, plan.options, plan.outputs, self.store,
                                           batch, self.dedup, self.consumers[plan.name].schemas, plan.routing,
                                           routing, self.state_cache)
            if isinstance(prepared, ShardResult):  # a newer owner committed this very batch: theirs now
                raise StaleBatchError(f"Interval {batch.shard} of {plan.name!r} already has batch "
                                      f"{batch.batch}, committed by another owner", got=batch.batch,
                                      hint="this worker drops the interval and goes on")
        except (FencedWriterError, StaleBatchError) as exc:
            self._lose(plan, interval_, exc)
            return None
        return prepared

    def _lose(self, plan: IntervalPlan, owned: OwnedInterval, exc: Exception) -> None:
        """Another worker owns the interval now: its writes win, this one drops it."""
        self.groups[plan.name].discard(owned.shard)
        self.state_cache.drop(plan.name, owned.shard)
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
