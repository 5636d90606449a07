"""The one batch path: the harness and the micro-batch runner run a computation's batch as
``run_shard_batch`` for each shard that has work, wherever the shard runs, then ``finish_batch``
once, where the batch is known to be complete; a continuous worker runs ``run_shard_batch`` for
each commit of a key interval it owns (the interval journals itself in that commit).

``run_shard_batch``: load the shard, drop duplicate ids, run user code, commit exactly once, or,
when an earlier attempt of the batch already committed, re-deliver its productions without
running user code again (docs/architecture.md §2.1 and §2.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..model import Computation, ComputationOptions
from .batch import InputRecord, Production, ShardBatch, shard_of
from .dedup import DedupIndex
from .ports import Journal, ShardStore
from .shard import ValueCheck, process_shard
from .transaction import ShardTransaction, TxState
from .watermark import output_low_watermark

__all__ = ["ShardResult", "BatchOutcome", "run_shard_batch", "DedupCache", "finish_batch", "run_batch"]


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
                lambda: store.all_seen_ids(computation, shard),
            )
            self._indexes[key] = index
        return index


def run_shard_batch(
    computation: Computation,
    name: str,
    options: ComputationOptions,
    outputs: frozenset[str] | None,
    store: ShardStore,
    batch: ShardBatch,
    dedup_cache: DedupCache | None = None,
    schemas: Mapping[str, ValueCheck] | None = None,
) -> ShardResult:
    """One shard's part of one batch, committed in one transaction (or re-delivered)."""
    keys = list(dict.fromkeys(r.key for r in batch.records))
    snapshot = store.load_shard(name, batch.shard, keys, batch.watermark_after, batch.wall_clock)
    txn = ShardTransaction(name, batch.shard, batch.batch, snapshot.version, options.exactly_once)
    if txn.already_committed:
        productions = txn.redeliver(store.committed_productions(name, batch.shard, batch.batch))
        return ShardResult(productions, txn.state)

    if not batch.records and not batch.rejected and not snapshot.due_timers and batch.journal_as is None:
        return ShardResult([], txn.state)  # nothing to do: no write (an interval's batch always journals)

    is_duplicate = None
    index = None
    if options.dedup and batch.dedup_streams:
        index = (dedup_cache or DedupCache()).index(store, name, batch.shard)
        index.ensure(snapshot.version)
        is_duplicate = index.seen
    try:
        commit = process_shard(computation, name, options, outputs, batch, snapshot,
                               is_duplicate or (lambda ids: set()), schemas)
    except BaseException:
        txn.abort()
        raise
    txn.prepare(commit)
    productions = txn.commit(store)
    if index is not None:
        index.committed(batch.batch, (i for i, _ in commit.seen_ids))
    return ShardResult(productions, txn.state, commit.counters)


def finish_batch(journal: Journal, name: str, batch: int, input_watermark: int, previous_output: int,
                 sequencer: int) -> int:
    """Journal ``batch`` of computation ``name`` as complete; returns its output low watermark.

    Every shard of the batch has committed, so no work of the batch is unfinished, and every
    watermark timer still pending is later than ``input_watermark`` (a due one fired in its shard):
    the output watermark is the input watermark, never moving back (§2.4).
    """
    output = output_low_watermark(previous_output, input_watermark)
    return journal.complete_batch(name, batch, input_watermark, output, sequencer)


@dataclass
class BatchOutcome:
    productions: list[Production]
    counters: dict[str, int]
    output_watermark: int


def run_batch(computation: Computation, name: str, options: ComputationOptions, outputs: frozenset[str] | None,
              store: ShardStore, journal: Journal, *, batch: int, records: list[InputRecord],
              watermark_before: int, watermark_after: int, wall_clock: int, sequencer: int,
              previous_output: int, dedup_streams: frozenset[str],
              dedup_cache: DedupCache | None = None) -> BatchOutcome:
    """A whole batch in this process: every shard with input or a due timer, then ``finish_batch``."""
    per_shard: dict[int, list[InputRecord]] = {}
    for r in records:
        per_shard.setdefault(shard_of(r.key, options.shards), []).append(r)
    shards = set(per_shard) | set(store.shards_with_due_timers(name, watermark_after, wall_clock))
    productions: list[Production] = []
    counters: dict[str, int] = {}
    for shard in sorted(shards):
        result = run_shard_batch(computation, name, options, outputs, store, ShardBatch(
            name, shard, batch, per_shard.get(shard, []), watermark_before, watermark_after, wall_clock,
            sequencer, dedup_streams), dedup_cache)
        productions.extend(result.productions)
        for k, v in result.counters.items():
            counters[k] = counters.get(k, 0) + v
    output = finish_batch(journal, name, batch, watermark_after, previous_output, sequencer)
    return BatchOutcome(productions, counters, output)
