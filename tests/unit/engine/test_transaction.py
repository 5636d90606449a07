"""engine/transaction.py: one shard's batch as a state machine. Only the drawn transitions exist,
a stale batch is refused, and a commit the store refuses leaves the transaction aborted."""

from __future__ import annotations

from typing import Any

import itertools
import re

import pytest

from headrace.engine import Production, ShardCommit, ShardTransaction, TxState
from headrace.errors import StaleBatchError, StoreError

ALLOWED = {
    (TxState.OPEN, TxState.PREPARED),
    (TxState.OPEN, TxState.REDELIVERED),
    (TxState.OPEN, TxState.ABORTED),
    (TxState.PREPARED, TxState.COMMITTED),
    (TxState.PREPARED, TxState.ABORTED),
}
FORBIDDEN = sorted(set(itertools.product(TxState, TxState)) - ALLOWED, key=lambda p: (p[0].value, p[1].value))
PRODUCED = [Production("out", "k", {"n": 1}, 10, "Counter:0:5:1")]


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


class RecordingStore:
    """What ``commit`` needs of a store: ``commit_shard``, here recording or refusing."""

    def __init__(self, refuse_with: BaseException | None = None) -> None:
        self.refuse_with = refuse_with
        self.commits: list[ShardCommit] = []

    def commit_shard(self, commit: ShardCommit) -> None:
        if self.refuse_with is not None:
            raise self.refuse_with
        self.commits.append(commit)


def transaction(batch: int = 5, base_version: int = 4, exactly_once: bool = True) -> ShardTransaction:
    return ShardTransaction("Counter", 0, batch, base_version, exactly_once)


def commit_for(txn: ShardTransaction, batch: int | None = None, base_version: int | None = None) -> ShardCommit:
    return ShardCommit("Counter", 0, txn.batch if batch is None else batch,
                       txn.base_version if base_version is None else base_version, sequencer=1,
                       productions=list(PRODUCED))


def in_state(state: TxState) -> ShardTransaction:
    """A transaction brought to ``state`` through its public methods."""
    txn = transaction()
    if state is TxState.PREPARED or state is TxState.COMMITTED:
        txn.prepare(commit_for(txn))
    if state is TxState.COMMITTED:
        txn.commit(RecordingStore())  # type: ignore[arg-type]
    if state is TxState.REDELIVERED:
        txn.redeliver([])
    if state is TxState.ABORTED:
        txn.abort()
    assert txn.state is state
    return txn


def test_open_prepared_committed() -> None:
    txn = transaction()
    assert txn.state is TxState.OPEN
    commit = commit_for(txn)
    assert txn.prepare(commit) is commit
    assert txn.state is TxState.PREPARED
    store = RecordingStore()
    assert txn.commit(store) == PRODUCED  # type: ignore[arg-type]
    assert txn.state is TxState.COMMITTED
    assert store.commits == [commit]
    assert txn.productions == PRODUCED


def test_open_redelivered() -> None:
    txn = transaction(batch=5, base_version=5)
    assert txn.redeliver(PRODUCED) == PRODUCED
    assert txn.state is TxState.REDELIVERED
    assert txn.productions == PRODUCED


@pytest.mark.parametrize("start", [TxState.OPEN, TxState.PREPARED])
def test_abort_from_open_or_prepared(start: TxState) -> None:
    txn = in_state(start)
    txn.abort()
    assert txn.state is TxState.ABORTED


@pytest.mark.parametrize("start, to", sorted(ALLOWED, key=lambda p: (p[0].value, p[1].value)),
                         ids=lambda s: s.value)
def test_every_allowed_transition_moves(start: TxState, to: TxState) -> None:
    txn = in_state(start)
    txn._move(to)
    assert txn.state is to


@pytest.mark.parametrize("start, to", FORBIDDEN, ids=lambda s: s.value)
def test_every_other_transition_is_refused(start: TxState, to: TxState) -> None:
    txn = in_state(start)
    with pytest.raises(RuntimeError, match=exact(f"shard transaction cannot go from {start.value} to {to.value}")):
        txn._move(to)
    assert txn.state is start


def test_the_public_moves_out_of_a_final_state_are_refused() -> None:
    txn = in_state(TxState.COMMITTED)
    with pytest.raises(RuntimeError, match=exact("shard transaction cannot go from committed to aborted")):
        txn.abort()
    with pytest.raises(RuntimeError, match=exact("shard transaction cannot go from committed to redelivered")):
        txn.redeliver([])
    with pytest.raises(RuntimeError, match=exact("shard transaction cannot go from committed to prepared")):
        txn.prepare(commit_for(txn))


def test_a_stale_batch_is_refused() -> None:
    with pytest.raises(StaleBatchError, match=exact(
            "Shard 3 of 'Counter' is at batch 8, past batch 7 (got 7). "
            "Hint: a newer attempt already committed; this attempt is stale and must stop")):
        ShardTransaction("Counter", 3, batch=7, base_version=8)


def test_at_least_once_takes_a_batch_the_shard_has_passed() -> None:
    txn = ShardTransaction("Counter", 3, batch=7, base_version=8, exactly_once=False)
    assert txn.state is TxState.OPEN
    assert not txn.already_committed


@pytest.mark.parametrize("base_version, exactly_once, expected", [
    (5, True, True),
    (4, True, False),
    (5, False, False),
    (4, False, False),
])
def test_already_committed_only_when_the_shard_is_at_this_batch_with_exactly_once(
        base_version: int, exactly_once: bool, expected: bool) -> None:
    assert transaction(batch=5, base_version=base_version, exactly_once=exactly_once).already_committed is expected


@pytest.mark.parametrize("failure", [
    StoreError("disk full", got="commit", hint="free space"),
    KeyboardInterrupt(),  # an interrupt mid-commit aborts too
], ids=["store-error", "interrupt"])
def test_a_commit_the_store_refuses_ends_aborted_and_reraises(failure: BaseException) -> None:
    txn = in_state(TxState.PREPARED)
    with pytest.raises(type(failure)) as raised:
        txn.commit(RecordingStore(refuse_with=failure))  # type: ignore[arg-type]
    assert raised.value is failure
    assert txn.state is TxState.ABORTED
    assert txn.productions == []


@pytest.mark.parametrize("batch, base_version", [(6, 4), (5, 3), (4, 4)])
def test_prepare_refuses_a_commit_of_another_batch_or_base_version(batch: int, base_version: int) -> None:
    txn = transaction(batch=5, base_version=4)
    with pytest.raises(RuntimeError, match=exact("commit does not belong to this transaction")):
        txn.prepare(commit_for(txn, batch=batch, base_version=base_version))
    assert txn.state is TxState.OPEN
    assert txn.commit_record is None


class GroupStore:
    """What ``commit_together`` needs of a store: ``commit_shards``, refusing some commits or all."""

    def __init__(self, refuse: dict[int, StoreError] | None = None, fail: BaseException | None = None) -> None:
        self.refuse, self.fail = refuse or {}, fail

    def commit_shards(self, commits: list[ShardCommit], quiet: Any = ()) -> list[StoreError | None]:
        if self.fail is not None:
            raise self.fail
        return [self.refuse.get(c.shard) for c in commits]


def prepared(shard: int) -> ShardTransaction:
    txn = ShardTransaction("Counter", shard, 5, 4)
    txn.prepare(ShardCommit("Counter", shard, 5, 4, sequencer=1, productions=list(PRODUCED)))
    return txn


def test_transactions_committed_together_end_each_in_its_own_state() -> None:
    refused = StaleBatchError("Shard 1 moved", got=5)
    txns = [prepared(0), prepared(1)]
    assert ShardTransaction.commit_together(GroupStore({1: refused}), txns) == [None, refused]  # type: ignore[arg-type]
    assert [t.state for t in txns] == [TxState.COMMITTED, TxState.ABORTED]
    assert (txns[0].productions, txns[1].productions) == (PRODUCED, [])


def test_a_group_commit_that_fails_aborts_every_transaction_and_raises() -> None:
    txns = [prepared(0), prepared(1)]
    with pytest.raises(KeyboardInterrupt):
        ShardTransaction.commit_together(GroupStore(fail=KeyboardInterrupt()), txns)  # type: ignore[arg-type]
    assert [t.state for t in txns] == [TxState.ABORTED, TxState.ABORTED]


def test_only_prepared_transactions_commit_together() -> None:
    with pytest.raises(RuntimeError, match=exact("shard transaction cannot commit from open: prepare(commit) first")):
        ShardTransaction.commit_together(GroupStore(), [prepared(0), transaction()])  # type: ignore[arg-type]
