"""Re-partitioning a computation's keys from one shard count to another (docs/architecture.md §3.6,
"Rescaling"), run by ``SQLStore.register`` inside its transaction, so a crash leaves the old
layout or the new one, never a mix.

What is keyed by shard, and how it moves:

- ``state`` has no shard column: nothing to move.
- ``timers`` and ``partials`` carry their key: each row gets ``shard_of(key, new)``.
- ``seen_ids`` carry no key, so an id cannot be placed by its key: every new shard gets every id
  of the old layout (a superset: ids are unique, so another key's id never drops a record; the
  copies age out with the ids' garbage collection). So does ``seen_ranges``: the old shards'
  ranges are merged, one prefix at a time, and every new shard gets the merged ones.
- ``shards``: the old rows make way for ``new`` rows at the version the journal has reached, with
  the smallest input and output watermarks of the old rows (a new shard may own keys of the
  slowest old one), stamped with a fresh sequencer: every writer of the old layout is fenced.
- ``segments`` are slotted by the *producer's* shard and read by batch whatever the slot, and each
  consumer keys what it reads with its own count when it reads it: nothing to move.
- ``positions`` (continuous mode; micro-batch mode reads from the query's offsets): see
  ``_restart_intervals``.
"""

from __future__ import annotations

import json

from ..engine.batch import shard_of
from ..engine.ports import Fence
from ..engine.seen import SeenRange, merge_ranges
from ..errors import StoreError
from ..names import CONTINUOUS, interval, meta
from .connection import Connection

__all__ = ["Rescaling"]


class Rescaling(Connection):
    """``rescale`` (called by ``register`` in its transaction) and the fences it leaves."""

    def rescale(self, computation: str, old: int, new: int, mode: str) -> None:
        """Move ``computation`` (run in ``mode``) from ``old`` shards to ``new``; the caller holds the
        write transaction."""
        _rescale(self, computation, old, new, mode == CONTINUOUS)

    def fences_of(self, computation: str) -> tuple[Fence, ...]:
        """The positions of the layouts a continuous computation was rescaled from (oldest first)."""
        return tuple(_fences(self, computation))

    def interval_positions(self, computation: str) -> dict[int, dict[str, int]]:
        """Per interval of a continuous computation, where it has read up to: what its commits
        wrote, or further, where its owner reported it quiet (``report_quiet``)."""
        out: dict[int, dict[str, int]] = {}
        for shard, producer, batch in self._all(
                "SELECT shard, producer, batch FROM positions WHERE computation = ? AND shard >= 0", (computation,)):
            out.setdefault(int(shard), {})[str(producer)] = int(batch)
        for shard, text in self._all(
                "SELECT s.shard, g.positions FROM shards s JOIN interval_groups g ON g.computation = s.computation "
                "AND g.sequencer = s.sequencer WHERE s.computation = ?", (computation,)):
            own = out.setdefault(int(shard), {})
            for producer, batch in json.loads(text).items():
                own[producer] = max(own.get(producer, 0), int(batch))
        return out


def _rescale(store: Rescaling, computation: str, old: int, new: int, continuous: bool) -> None:
    # every shard commit locks its shard row first: holding them all, no commit of the old layout
    # is in flight, and each statement below sees what the last one wrote (PostgreSQL)
    store._all(f"SELECT shard FROM shards WHERE computation = ? ORDER BY shard{store.FOR_UPDATE}", (computation,))
    positions = store.interval_positions(computation)
    if not continuous:
        _refuse_half_committed(store, computation, old, new)
    low_in, low_out, top = store._one("SELECT MIN(input_watermark), MIN(output_watermark), MAX(version) FROM shards "
                                      "WHERE computation = ?", (computation,))
    if continuous:  # each interval is a producer C/<i> whose batches are its versions: go past them all
        version = max(int(top), _parts_journaled(store, computation)) + 1
    else:  # every shard is at the journaled batch or behind (it had no work since)
        version = int(store._one("SELECT MAX(batch) FROM batches WHERE producer = ?", (computation,))[0] or 0)
    sequencer = store._next_sequencer(computation)
    _move_keyed(store, "timers", computation, new)
    _move_keyed(store, "partials", computation, new)
    store._step("rescale")  # a kill here must leave the old layout: half the rows moved, none committed
    ids = store._all("SELECT id, MAX(timestamp) FROM seen_ids WHERE computation = ? GROUP BY id", (computation,))
    store._x("DELETE FROM seen_ids WHERE computation = ?", (computation,))
    store._xmany("INSERT INTO seen_ids VALUES (?, ?, ?, ?)",
                 [(computation, s, i, int(ts)) for s in range(new) for i, ts in ids])
    ranges = merge_ranges(SeenRange(p, int(lo), int(hi), int(n), bytes(b)) for p, lo, hi, n, b in store._all(
        "SELECT prefix, low, high, newest, bits FROM seen_ranges WHERE computation = ?", (computation,)))
    store._x("DELETE FROM seen_ranges WHERE computation = ?", (computation,))
    store._xmany("INSERT INTO seen_ranges VALUES (?, ?, ?, ?, ?, ?, ?)",
                 [(computation, s, *r) for s in range(new) for r in ranges])
    store._x("DELETE FROM shards WHERE computation = ?", (computation,))
    store._x("DELETE FROM interval_groups WHERE computation = ?", (computation,))
    store._xmany("INSERT INTO shards(computation, shard, version, input_watermark, output_watermark, sequencer) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 [(computation, s, version, int(low_in), int(low_out), sequencer) for s in range(new)])
    if continuous:
        _restart_intervals(store, computation, old, new, positions, version, int(low_in), int(low_out))
    store._x("UPDATE computations SET shards = ? WHERE name = ?", (new, computation))
    now = store.now()
    store._x("INSERT INTO events VALUES (?, ?, ?, ?) ON CONFLICT(name, kind, at) DO UPDATE SET detail = "
             "excluded.detail", (computation, now, "rescaled", json.dumps({"from": old, "to": new})))


def _parts_journaled(store: Connection, computation: str) -> int:
    """The highest batch any interval ``C/<i>`` of the computation journaled (0: none)."""
    row = store._one("SELECT MAX(batch) FROM batches WHERE producer >= ? AND producer < ?",
                     (computation + "/", computation + "0"))  # '0' follows '/': every name C/...
    return int(row[0] or 0)


def _restart_intervals(store: Connection, computation: str, old: int, new: int, positions: dict[int, dict[str, int]],
                       version: int, low_in: int, low_out: int) -> None:
    """Continuous mode: each new interval starts reading where the slowest old one stands, and a
    fence remembers where each old interval stood, so that a record an old interval already took
    for its keys is skipped (``IntervalClaim.fences``). Each new interval journals its starting
    watermarks, so its consumers never hold a watermark of an old interval above what it promises."""
    old_positions = {i: positions.get(i, {}) for i in range(old)}
    producers = sorted({p for ps in old_positions.values() for p in ps})
    start = {p: min(ps.get(p, 0) for ps in old_positions.values()) for p in producers}
    fences = [f for f in _fences(store, computation)
              if any(start.get(p, 0) < max(at.get(p, 0) for at in f[1].values()) for p in _producers_of(f))]
    if any(start[p] < at.get(p, 0) for at in old_positions.values() for p in producers):
        fences.append((old, old_positions))
    store._x("DELETE FROM positions WHERE computation = ? AND shard >= 0", (computation,))
    store._xmany("INSERT INTO positions VALUES (?, ?, ?, ?)",
                 [(computation, s, p, b) for s in range(new) for p, b in start.items()])
    store._x("INSERT INTO meta VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
             (meta.fences(computation), json.dumps([[n, {str(i): at for i, at in layer.items()}] for n, layer in fences])))
    now = store.now()
    store._xmany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, NULL, NULL)",
                 [(interval(computation, s), version, low_in, low_out, now) for s in range(new)])


def _producers_of(fence: Fence) -> set[str]:
    return {p for at in fence[1].values() for p in at}


def _fences(store: Connection, computation: str) -> list[Fence]:
    row = store._one("SELECT value FROM meta WHERE name = ?", (meta.fences(computation),))
    return [(int(n), {int(i): {str(p): int(b) for p, b in at.items()} for i, at in layer.items()})
            for n, layer in json.loads(row[0])] if row else []


def _refuse_half_committed(store: Connection, computation: str, old: int, new: int) -> None:
    journaled = store._one("SELECT MAX(batch) FROM batches WHERE producer = ?", (computation,))[0] or 0
    ahead = store._one("SELECT shard, version FROM shards WHERE computation = ? AND version > ? "
                       "ORDER BY shard LIMIT 1", (computation, journaled))
    if ahead is not None:
        raise StoreError(f"Rescaling {computation!r} from {old} to {new} shards in {store.shown_url} is refused: "
                         f"shard {ahead[0]} committed batch {ahead[1]}, which the journal has not completed (it is at "
                         f"batch {journaled})", got=new,
                         hint=f"run once more with shards={old} so that batch {ahead[1]} completes, then change shards")


def _move_keyed(store: Connection, table: str, computation: str, new: int) -> None:
    """Give every row of ``table`` (which has ``key`` and ``shard`` columns) its key's new shard."""
    rows = store._all(f"SELECT DISTINCT key, shard FROM {table} WHERE computation = ?", (computation,))
    store._xmany(f"UPDATE {table} SET shard = ? WHERE computation = ? AND key = ?",
                 [(shard_of(k, new), computation, k) for k, s in rows if shard_of(k, new) != s])
