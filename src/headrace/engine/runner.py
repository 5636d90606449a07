"""The one batch path: the harness and the micro-batch runner run a computation's batch as
``run_shard_batch`` for each shard that has work, wherever the shard runs, then ``finish_batch``
once, where the batch is known to be complete; a continuous worker runs ``run_shard_batch`` for
each commit of a key interval it owns (the interval journals itself in that commit).

``run_shard_batch``: load the shard, drop duplicate ids, run user code, commit exactly once, or,
when an earlier attempt of the batch already committed, re-deliver its productions without
running user code again (docs/architecture.md §2.1 and §2.3).
"""

from __future__ import annotations

import dataclasses
import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from ..errors import StoreError
from ..model import Computation, ComputationOptions, MonoidComputation
from ..names import STATE_TTL_TIMER
from .batch import InputRecord, Production, QuietReport, Routing, ShardBatch, ShardCommit, ShardSnapshot, shard_of
from .dedup import DedupIndex
from .seen import SeenIds
from .monoid import COMPACT_EVERY, process_monoid_shard, tag_window
from .ports import IntervalStore, Journal, ShardStore
from .routing import RoutingPlan
from .shard import ValueCheck, process_shard
from .statecache import StateCache
from .transaction import ShardTransaction, TxState
from .watermark import output_low_watermark

__all__ = ["collector_paused", "ShardResult", "BatchOutcome", "PreparedBatch", "prepare_shard_batch", "run_shard_batch", "commit_together",
           "DedupCache", "finish_batch", "run_batch"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a batch (or a continuous worker's pass). A batch
    allocates a tuple and a dict or two per record, which sets the collector off every 700
    allocations, and its full collections walk every object alive: up to half a pass over 500,000
    records (BENCHMARKS.md, "Where the time goes"). What a batch frees, reference counting frees;
    cycles wait for the collector's next run after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class ShardResult:
    productions: list[Production]
    state: TxState
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def redelivered(self) -> bool:
        return self.state is TxState.REDELIVERED


class DedupCache:
    """Dedup indexes kept between batches in one process, one per (store, computation, shard)."""

    def __init__(self) -> None:
        self._indexes: dict[tuple[str, str, int], DedupIndex] = {}

    def index(self, store: ShardStore, computation: str, shard: int) -> DedupIndex:
        key = (store.url, computation, shard)
        index = self._indexes.get(key)
        if index is None:
            index = DedupIndex(
                lambda ids: store.seen_ids(computation, shard, ids),
                lambda: store.exact_seen_ids(computation, shard),
                lambda prefix, low, high: store.seen_ranges(computation, shard, prefix, low, high),
                lambda: store.seen_range_extents(computation, shard),
            )
            self._indexes[key] = index
        return index


@dataclass
class PreparedBatch:
    """A shard's batch whose user code has run, waiting for its commit (alone or with others)."""
    txn: ShardTransaction
    commit: ShardCommit
    index: DedupIndex | None
    state_cache: StateCache | None = None

    def completed(self) -> ShardResult:
        """The result once ``txn`` committed."""
        if self.state_cache is not None:
            self.state_cache.committed(self.commit)
        if self.index is not None:
            self.index.committed(self.commit.batch, SeenIds(self.commit.seen_ids, self.commit.seen_ranges),
                                 self.commit.forget_ids_before)
        return ShardResult(self.txn.productions, self.txn.state, self.commit.counters)


def prepare_shard_batch(
    computation: Computation,
    name: str,
    options: ComputationOptions,
    outputs: frozenset[str] | None,
    store: ShardStore,
    batch: ShardBatch,
    dedup_cache: DedupCache | None = None,
    schemas: Mapping[str, ValueCheck] | None = None,
    routing_plan: RoutingPlan | None = None,
    routing: Routing | None = None,
    state_cache: StateCache | None = None,
) -> ShardResult | PreparedBatch:
    """Load the shard, drop duplicates and run user code: the batch prepared for its commit, or a
    result at once when there is nothing to commit (an earlier attempt's, re-delivered; no work).
    With a ``routing_plan``, the productions are routed for its consumers (``routing`` names the
    plan in the journal). A continuous worker passes its ``state_cache`` (``engine/statecache.py``)."""
    monoid = isinstance(computation, MonoidComputation)
    keys = [] if monoid else list(dict.fromkeys(r.key for r in batch.records))  # a monoid's commit reads no state
    tags = (STATE_TTL_TIMER,) if options.state_ttl_ms is not None else ()
    if monoid:
        state_cache = None
    if state_cache is not None:
        snapshot = state_cache.load(store, name, batch.shard, batch.sequencer, keys, batch.watermark_after,
                                    batch.wall_clock, tags)
    else:
        snapshot = store.load_shard(name, batch.shard, keys, batch.watermark_after, batch.wall_clock, tags)
    txn = ShardTransaction(name, batch.shard, batch.batch, snapshot.version, options.conditional_commits)
    if txn.already_committed:
        productions = txn.redeliver(store.committed_productions(name, batch.shard, batch.batch))
        return ShardResult(productions, txn.state)

    if (not batch.records and not batch.partials and not batch.rejected and not snapshot.due_timers
            and batch.journal_as is None):
        return ShardResult([], txn.state)  # nothing to do: no write (an interval's batch always journals)
    if options.state_semantics == "at_most_once":
        snapshot = _save_offset_first(store, name, batch, snapshot)
        txn = ShardTransaction(name, batch.shard, batch.batch, snapshot.version, exactly_once=False)

    check_ids = None
    index = None
    if options.dedup and batch.dedup_streams:
        index = (dedup_cache or DedupCache()).index(store, name, batch.shard)
        index.ensure(snapshot.version, batch.sequencer)
        check_ids = index.check
    try:
        if isinstance(computation, MonoidComputation):
            commit = process_monoid_shard(computation, name, options, outputs, batch, snapshot,
                                          _stored_partials(store, name, batch, snapshot),
                                          check_ids, schemas)
        else:
            commit = process_shard(computation, name, options, outputs, batch, snapshot,
                                   check_ids, schemas)
    except BaseException:
        txn.abort()
        raise
    if routing is not None and routing_plan is not None:
        commit.routing = routing._replace(routes=routing_plan.route_productions(commit.productions))
    return PreparedBatch(txn, txn.prepare(commit), index, state_cache)


def run_shard_batch(
    computation: Computation,
    name: str,
    options: ComputationOptions,
    outputs: frozenset[str] | None,
    store: ShardStore,
    batch: ShardBatch,
    dedup_cache: DedupCache | None = None,
    schemas: Mapping[str, ValueCheck] | None = None,
    routing_plan: RoutingPlan | None = None,
    routing: Routing | None = None,
) -> ShardResult:
    """One shard's part of one batch, committed in one transaction (or re-delivered)."""
    with collector_paused():
        prepared = prepare_shard_batch(computation, name, options, outputs, store, batch, dedup_cache, schemas,
                                       routing_plan, routing)
        if isinstance(prepared, ShardResult):
            return prepared
        prepared.txn.commit(store)
        return prepared.completed()


def commit_together(store: IntervalStore, prepared: list[PreparedBatch],
                    quiet: Sequence[QuietReport] = ()) -> list[ShardResult | StoreError]:
    """Commit several intervals' prepared batches in one store transaction, with the reports of the
    pass's quiet intervals: each one's result, or the error (fenced, stale) that refused it alone."""
    failures = ShardTransaction.commit_together(store, [p.txn for p in prepared], quiet)
    return [p.completed() if failure is None else failure for p, failure in zip(prepared, failures)]


def _save_offset_first(store: ShardStore, name: str, batch: ShardBatch, snapshot: ShardSnapshot) -> ShardSnapshot:
    """At-most-once state: the batch's input is marked consumed (the shard's version, an interval's
    positions) before user code runs. A crash from here on loses the batch: its retry finds it
    committed and re-delivers what was written of it. The state commit that follows is
    conditional on that version, so it is made at most once."""
    store.commit_shard(ShardCommit(name, batch.shard, batch.batch, snapshot.version, batch.sequencer,
                                   input_watermark=batch.watermark_before,
                                   output_watermark=snapshot.output_watermark, positions=batch.positions))
    return dataclasses.replace(snapshot, version=batch.batch)


def _stored_partials(store: ShardStore, name: str, batch: ShardBatch,
                     snapshot: ShardSnapshot) -> dict[tuple[str, int], list[bytes]]:
    """The delta rows a monoid shard batch needs: those of its due windows, or, in a compacting
    batch, every window's (read within the version check of the commit, so a retry sees the same)."""
    if batch.batch % COMPACT_EVERY == 0:
        return store.load_partials(name, batch.shard, None)
    due = [(t.key, w) for t in snapshot.due_timers if (w := tag_window(t.tag)) is not None]
    return store.load_partials(name, batch.shard, due) if due else {}


def finish_batch(journal: Journal, name: str, batch: int, input_watermark: int, previous_output: int,
                 sequencer: int, routing: Routing | None = None) -> int:
    """Journal ``batch`` of computation ``name`` as complete; returns its output low watermark.

    Every shard of the batch has committed, so no work of the batch is unfinished, and every
    watermark timer still pending is later than ``input_watermark`` (a due one fired in its shard):
    the output watermark is the input watermark, never moving back (§2.4).
    """
    output = output_low_watermark(previous_output, input_watermark)
    return journal.complete_batch(name, batch, input_watermark, output, sequencer, routing)


@dataclass
class BatchOutcome:
    productions: list[Production]
    counters: dict[str, int]
    output_watermark: int


def run_batch(computation: Computation, name: str, options: ComputationOptions, outputs: frozenset[str] | None,
              store: ShardStore, journal: Journal, *, batch: int, records: list[InputRecord],
              watermark_before: int, watermark_after: int, wall_clock: int, sequencer: int,
              previous_output: int, dedup_streams: frozenset[str],
              dedup_cache: DedupCache | None = None, schemas: Mapping[str, ValueCheck] | None = None,
              rejected: Sequence[InputRecord] = ()) -> BatchOutcome:
    """A whole batch in this process: every shard with input or a due timer, then ``finish_batch``;
    ``rejected`` input (``engine/intake.py``) is shard 0's to dead-letter."""
    per_shard: dict[int, list[InputRecord]] = {}
    for r in records:
        per_shard.setdefault(shard_of(r.key, options.shards), []).append(r)
    shards = set(per_shard) | set(store.shards_with_due_timers(name, watermark_after, wall_clock))
    if rejected:
        shards.add(0)
    productions: list[Production] = []
    counters: dict[str, int] = {}
    for shard in sorted(shards):
        result = run_shard_batch(computation, name, options, outputs, store, ShardBatch(
            name, shard, batch, per_shard.get(shard, []), watermark_before, watermark_after, wall_clock,
            sequencer, dedup_streams, list(rejected) if shard == 0 else []), dedup_cache, schemas)
        productions.extend(result.productions)
        for k, v in result.counters.items():
            counters[k] = counters.get(k, 0) + v
    output = finish_batch(journal, name, batch, watermark_after, previous_output, sequencer)
    return BatchOutcome(productions, counters, output)
