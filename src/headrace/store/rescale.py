"""Re-partitioning a computation's keys from one shard count to another (docs/architecture.md §3.6,
"Rescaling"), run by ``SQLStore.register`` inside its transaction, so a crash leaves the old
layout or the new one, never a mix.

What is keyed by shard, and how it moves:

- ``state`` has no shard column: nothing to move.
- ``timers`` and ``partials`` carry their key: each row gets ``shard_of(key, new)``.
- ``seen_ids`` carry no key, so an id cannot be placed by its key: every new shard gets every id
  of the old layout (a superset: ids are unique, so another key's id never drops a record; the
  copies age out with the ids' garbage collection).
- ``shards``: the old rows make way for ``new`` rows at the version the journal has reached, with
  the smallest input and output watermarks of the old rows (a new shard may own keys of the
  slowest old one), stamped with a fresh sequencer: every writer of the old layout is fenced.
- ``segments`` are slotted by the *producer's* shard and read by batch whatever the slot, and each
  consumer keys what it reads with its own count when it reads it: nothing to move.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from ..engine.batch import shard_of
from ..errors import StoreError

if TYPE_CHECKING:
    from .sql import SQLStore

__all__ = ["rescale"]


def rescale(store: "SQLStore", computation: str, old: int, new: int) -> None:
    """Move ``computation`` from ``old`` shards to ``new``; the caller holds the write transaction."""
    _refuse_unsafe(store, computation, old, new)
    row = store._one("SELECT MAX(batch) FROM batches WHERE producer = ?", (computation,))
    journaled = int(row[0] or 0)
    low_in, low_out = store._one("SELECT MIN(input_watermark), MIN(output_watermark) FROM shards "
                                 "WHERE computation = ?", (computation,))
    sequencer = store._next_sequencer(computation)
    _move_keyed(store, "timers", computation, new)
    _move_keyed(store, "partials", computation, new)
    store._step("rescale")  # a kill here must leave the old layout: half the rows moved, none committed
    ids = store._all("SELECT id, MAX(timestamp) FROM seen_ids WHERE computation = ? GROUP BY id", (computation,))
    store._x("DELETE FROM seen_ids WHERE computation = ?", (computation,))
    store._xmany("INSERT INTO seen_ids VALUES (?, ?, ?, ?)",
                 [(computation, s, i, int(ts)) for s in range(new) for i, ts in ids])
    store._x("DELETE FROM shards WHERE computation = ?", (computation,))
    store._xmany("INSERT INTO shards(computation, shard, version, input_watermark, output_watermark, sequencer) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 [(computation, s, journaled, int(low_in), int(low_out), sequencer) for s in range(new)])
    store._x("UPDATE computations SET shards = ? WHERE name = ?", (new, computation))
    now = int(time.time() * 1000)
    store._x("INSERT INTO events VALUES (?, ?, ?, ?) ON CONFLICT(name, kind, at) DO UPDATE SET detail = "
             "excluded.detail", (computation, now, "rescaled", json.dumps({"from": old, "to": new})))


def _refuse_unsafe(store: "SQLStore", computation: str, old: int, new: int) -> None:
    change = f"Rescaling {computation!r} from {old} to {new} shards in {store.shown_url}"
    row = store._one("SELECT COUNT(*) FROM positions WHERE computation = ? AND shard >= 0", (computation,))
    if row[0]:
        raise StoreError(f"{change} is refused: it ran in continuous mode, whose key intervals keep "
                         "their own input positions", got=new,
                         hint=f"keep shards={old} for this computation in continuous mode, or give the "
                              "rescaled computation a new name")
    journaled = store._one("SELECT MAX(batch) FROM batches WHERE producer = ?", (computation,))[0] or 0
    ahead = store._one("SELECT shard, version FROM shards WHERE computation = ? AND version > ? "
                       "ORDER BY shard LIMIT 1", (computation, journaled))
    if ahead is not None:
        raise StoreError(f"{change} is refused: shard {ahead[0]} committed batch {ahead[1]}, which the journal "
                         f"has not completed (it is at batch {journaled})", got=new,
                         hint=f"run once more with shards={old} so that batch {ahead[1]} completes, then change shards")


def _move_keyed(store: "SQLStore", table: str, computation: str, new: int) -> None:
    """Give every row of ``table`` (which has ``key`` and ``shard`` columns) its key's new shard."""
    rows = store._all(f"SELECT DISTINCT key, shard FROM {table} WHERE computation = ?", (computation,))
    store._xmany(f"UPDATE {table} SET shard = ? WHERE computation = ? AND key = ?",
                 [(shard_of(k, new), computation, k) for k, s in rows if shard_of(k, new) != s])
