"""The engine: pure Python, no Spark. One key shard, one batch, one atomic commit."""

from .batch import InputRecord, Production, ShardBatch, ShardCommit, ShardSnapshot, shard_of
from .runner import DedupCache, ShardResult, run_shard_batch
from .shard import process_shard
from .transaction import ShardTransaction, TxState

__all__ = [
    "InputRecord", "Production", "ShardBatch", "ShardCommit", "ShardSnapshot", "shard_of",
    "DedupCache", "ShardResult", "run_shard_batch", "process_shard", "ShardTransaction", "TxState",
]
