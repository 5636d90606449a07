"""The engine: pure Python, no Spark, nothing from ``headrace.store``. One key shard, one batch,
one atomic commit; the ports it needs are declared in ``engine.ports``."""

from .batch import InputRecord, Partial, Production, ShardBatch, ShardCommit, ShardSnapshot, shard_of
from .ports import BatchInfo, Bus, Journal, ShardStore, StoredRecord
from .runner import BatchOutcome, DedupCache, ShardResult, finish_batch, run_batch, run_shard_batch
from .shard import process_shard
from .transaction import ShardTransaction, TxState

__all__ = [
    "InputRecord", "Partial", "Production", "ShardBatch", "ShardCommit", "ShardSnapshot", "shard_of",
    "BatchInfo", "Bus", "Journal", "ShardStore", "StoredRecord",
    "BatchOutcome", "DedupCache", "ShardResult", "finish_batch", "run_batch", "run_shard_batch",
    "process_shard", "ShardTransaction", "TxState",
]
