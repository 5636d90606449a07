"""The backing store interface: everything that must survive a crash lives behind it.

Implementations: ``SQLiteStore`` (embedded default). Every implementation passes the same
conformance tests (tests/unit/store).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol

from ..engine.batch import DueTimer, Production, ShardCommit, ShardSnapshot

__all__ = ["Store", "CommitStep", "COMMIT_STEPS", "BatchInfo", "StoredRecord"]

# The steps of one shard commit, in order; a failpoint may be installed before each one.
COMMIT_STEPS = (
    "weak_productions",  # only with weak productions: their own transaction, before the main one
    "begin",
    "check_sequencer",
    "state",
    "timers",
    "seen_ids",
    "productions",
    "counters",
    "version",
    "before_commit",
    "after_commit",
)
CommitStep = str
Failpoint = Callable[[CommitStep], None]


class BatchInfo(NamedTuple):
    """A completed batch of a producer (a computation, or ``inject:<stream>``) in the journal."""

    producer: str
    batch: int
    input_watermark: int
    output_watermark: int
    completed_at: int


class StoredRecord(NamedTuple):
    key: str | None
    value: Any
    timestamp: int
    id: str


class Store(Protocol):
    url: str
    failpoint: Failpoint | None

    # -- writers --------------------------------------------------------------------------------
    def register(self, computation: str, shards: int) -> None: ...
    def acquire_writer(self, computation: str) -> int: ...
    def sequencer(self, computation: str) -> int: ...

    # -- one shard batch --------------------------------------------------------------------------
    def load_shard(self, computation: str, shard: int, keys: list[str], watermark: int, wall_clock: int) -> ShardSnapshot: ...
    def seen_ids(self, computation: str, shard: int, ids: list[str]) -> set[str]: ...
    def all_seen_ids(self, computation: str, shard: int) -> Iterable[str]: ...
    def commit_shard(self, commit: ShardCommit) -> None: ...
    def committed_productions(self, computation: str, shard: int, batch: int) -> list[Production]: ...
    def shards_with_due_timers(self, computation: str, watermark: int, wall_clock: int) -> list[int]: ...
    def watermark_holds(self, computation: str) -> list[int]: ...
    def next_wall_timer(self, computation: str) -> int | None: ...

    # -- the bus and the watermark journal ----------------------------------------------------------
    def append_segment(self, stream: str, producer: str, batch: int, shard: int, records: list[Production]) -> None: ...
    def complete_batch(self, producer: str, batch: int, input_watermark: int, output_watermark: int, sequencer: int | None = None) -> int: ...
    def batches(self, producer: str, after: int = 0) -> list[BatchInfo]: ...
    def latest_batch(self, producer: str) -> BatchInfo | None: ...
    def batch_info(self, producer: str, batch: int) -> BatchInfo | None: ...
    def publish(self, producer: str, batch: int, records: dict[str, list[Production]], watermark: int,
                checkpoint: str | None = None) -> None: ...
    def checkpoint(self, producer: str) -> str | None: ...
    def stream_producers(self, stream: str) -> list[str]: ...
    def segment_blobs(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> list[tuple[int, int, bytes]]: ...
    def read_segments(self, stream: str, producer: str, after_batch: int, upto_batch: int) -> Iterator[tuple[int, StoredRecord]]: ...

    # -- reading back -------------------------------------------------------------------------------
    def state(self, computation: str, key: str) -> bytes | None: ...
    def timers(self, computation: str, key: str) -> list[DueTimer]: ...
    def counters(self, computation: str) -> dict[str, int]: ...
    def shard_versions(self, computation: str) -> dict[int, int]: ...
    def close(self) -> None: ...
