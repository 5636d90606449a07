"""The backing store interface: everything that must survive a crash lives behind it.

A store implements the engine's ports (``headrace.engine.ports``: shard state, the bus, the
journal) plus what runners and tools need around them. Implementations: ``SQLiteStore``
(embedded default) and ``PostgresStore``; both pass the same conformance tests (tests/unit/store).
"""

from __future__ import annotations

from typing import Callable, Protocol

from ..engine.ports import BatchInfo, Bus, Journal, ShardStore, StoredRecord

__all__ = ["Store", "CommitStep", "COMMIT_STEPS", "BatchInfo", "StoredRecord", "DEFAULT_STORE_URL"]

# The embedded default: one SQLite file in the working directory.
DEFAULT_STORE_URL = "sqlite:///headrace.db"

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


class Store(ShardStore, Bus, Journal, Protocol):
    """The engine's ports, plus writers, streams, resume points and reading back."""

    shown_url: str  # the URL without its password, for messages
    failpoint: Failpoint | None

    # -- writers --------------------------------------------------------------------------------
    def register(self, computation: str, shards: int) -> None: ...
    def acquire_writer(self, computation: str) -> int: ...
    def sequencer(self, computation: str) -> int: ...

    # -- streams and injectors --------------------------------------------------------------------
    def declare_stream(self, stream: str, producer: str) -> None: ...
    def streams(self) -> list[str]: ...
    def checkpoint(self, producer: str) -> str | None: ...
    def journal_heads(self) -> list[BatchInfo]: ...
    def trim_segments(self, older_than_ms: int) -> int: ...
    def batch_before(self, producer: str, time_ms: int) -> int: ...
    def instance_id(self) -> str: ...

    # -- reading back -------------------------------------------------------------------------------
    def state(self, computation: str, key: str) -> bytes | None: ...
    def oldest_watermark_timer(self, computation: str) -> int | None: ...
    def counters(self, computation: str) -> dict[str, int]: ...
    def shard_versions(self, computation: str) -> dict[int, int]: ...
    def close(self) -> None: ...
