"""Exactly-once as an explicit state machine: one shard, one batch, one transaction.

    OPEN ──prepare──► PREPARED ──commit──► COMMITTED
      │                  │
      └──────abort───────┴──► ABORTED
    OPEN ──already committed by an earlier attempt──► REDELIVERED

Prepared transactions of several shards may commit together (``commit_together``: one store
transaction, each shard's outcome written whole or refused on its own).

A shard's version is the last batch it committed; versions only move forward.
"""

from __future__ import annotations

import enum
from typing import Sequence

from ..errors import StaleBatchError, StoreError
from .batch import Production, QuietReport, ShardCommit
from .ports import IntervalStore, ShardStore

__all__ = ["TxState", "ShardTransaction"]


class TxState(enum.Enum):
    OPEN = "open"
    PREPARED = "prepared"
    COMMITTED = "committed"
    REDELIVERED = "redelivered"
    ABORTED = "aborted"


_ALLOWED = {
    TxState.OPEN: {TxState.PREPARED, TxState.REDELIVERED, TxState.ABORTED},
    TxState.PREPARED: {TxState.COMMITTED, TxState.ABORTED},
}


class ShardTransaction:
    def __init__(self, computation: str, shard: int, batch: int, base_version: int, exactly_once: bool = True):
        if exactly_once and base_version > batch:
            raise StaleBatchError(
                f"Shard {shard} of {computation!r} is at batch {base_version}, past batch {batch}",
                got=batch,
                hint="a newer attempt already committed; this attempt is stale and must stop",
            )
        self.computation = computation
        self.shard = shard
        self.batch = batch
        self.base_version = base_version
        self.exactly_once = exactly_once
        self.state = TxState.OPEN
        self.commit_record: ShardCommit | None = None
        self.productions: list[Production] = []

    @property
    def already_committed(self) -> bool:
        """An earlier attempt of this very batch committed: re-deliver, do not re-run user code."""
        return self.exactly_once and self.base_version == self.batch

    def _move(self, to: TxState) -> None:
        if to not in _ALLOWED.get(self.state, set()):
            raise RuntimeError(f"shard transaction cannot go from {self.state.value} to {to.value}")
        self.state = to

    def redeliver(self, productions: list[Production]) -> list[Production]:
        self._move(TxState.REDELIVERED)
        self.productions = productions
        return productions

    def prepare(self, commit: ShardCommit) -> ShardCommit:
        if commit.batch != self.batch or commit.base_version != self.base_version:
            raise RuntimeError("commit does not belong to this transaction")
        self._move(TxState.PREPARED)
        self.commit_record = commit
        return commit

    def commit(self, store: ShardStore) -> list[Production]:
        if self.state is not TxState.PREPARED or self.commit_record is None:
            raise RuntimeError(f"shard transaction cannot commit from {self.state.value}: prepare(commit) first")
        try:
            store.commit_shard(self.commit_record)
        except BaseException:
            self._move(TxState.ABORTED)
            raise
        self._move(TxState.COMMITTED)
        self.productions = self.commit_record.productions
        return self.productions

    def abort(self) -> None:
        self._move(TxState.ABORTED)

    @staticmethod
    def commit_together(store: IntervalStore, txns: list["ShardTransaction"],
                        quiet: Sequence[QuietReport] = ()) -> list[StoreError | None]:
        """Commit prepared transactions of several shards in one store transaction (with ``quiet``,
        the reports of the pass's quiet intervals); each one the store refuses (fenced, stale) is
        aborted, and its error returned in its place."""
        for t in txns:
            if t.state is not TxState.PREPARED or t.commit_record is None:
                raise RuntimeError(f"shard transaction cannot commit from {t.state.value}: prepare(commit) first")
        try:
            failures = store.commit_shards([t.commit_record for t in txns if t.commit_record is not None], quiet)
        except BaseException:
            for t in txns:
                t._move(TxState.ABORTED)
            raise
        for t, failure in zip(txns, failures):
            t._move(TxState.ABORTED if failure is not None else TxState.COMMITTED)
            if failure is None and t.commit_record is not None:
                t.productions = t.commit_record.productions
        return failures
