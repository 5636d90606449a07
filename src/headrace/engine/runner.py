"""One shard batch end to end: load, dedup, run user code, commit exactly once, or re-deliver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..model import Computation, ComputationOptions
from .batch import Production, ShardBatch
from .dedup import DedupIndex
from .shard import process_shard
from .transaction import ShardTransaction, TxState

if TYPE_CHECKING:
    from ..store.base import Store

__all__ = ["ShardResult", "run_shard_batch", "DedupCache"]


@dataclass
class ShardResult:
    productions: list[Production]
    state: TxState
    counters: dict[str, int] = field(default_factory=dict)
    output_watermark: int = 0

    @property
    def redelivered(self) -> bool:
        return self.state is TxState.REDELIVERED


class DedupCache:
    """Dedup indexes kept between batches in one process, one per (store, computation, shard)."""

    def __init__(self) -> None:
        self._indexes: dict[tuple[str, str, int], DedupIndex] = {}

    def index(self, store: "Store", computation: str, shard: int) -> DedupIndex:
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
    store: "Store",
    batch: ShardBatch,
    dedup_cache: DedupCache | None = None,
) -> ShardResult:
    keys = list(dict.fromkeys(r.key for r in batch.records))
    snapshot = store.load_shard(name, batch.shard, keys, batch.watermark_after, batch.wall_clock)
    txn = ShardTransaction(name, batch.shard, batch.batch, snapshot.version, options.exactly_once)
    if txn.already_committed:
        productions = txn.redeliver(store.committed_productions(name, batch.shard, batch.batch))
        return ShardResult(productions, txn.state, output_watermark=snapshot.output_watermark)

    if not batch.records and not batch.rejected and not snapshot.due_timers:
        return ShardResult([], txn.state, output_watermark=snapshot.output_watermark)  # nothing to do: no write

    is_duplicate = None
    index = None
    if options.dedup and batch.dedup_streams:
        index = (dedup_cache or DedupCache()).index(store, name, batch.shard)
        index.ensure(snapshot.version)
        is_duplicate = index.seen
    try:
        commit = process_shard(computation, name, options, outputs, batch, snapshot,
                               is_duplicate or (lambda ids: set()))
    except BaseException:
        txn.abort()
        raise
    txn.prepare(commit)
    productions = txn.commit(store)
    if index is not None:
        index.committed(batch.batch, (i for i, _ in commit.seen_ids))
    return ShardResult(productions, txn.state, commit.counters, commit.output_watermark)
