"""The process test_sigkill.py kills: a keyed counter committing large shard batches in a loop.

    python sigkill_child.py DB_PATH BATCHES [STALL_BATCH:STALL_SHARD MARKER_PATH]

It resumes after the last journaled batch (shards already at a batch re-deliver it), prints
``ready <first batch>`` once the store is open, ``done`` when every batch is committed. With a
stall, the commit of that shard batch writes MARKER_PATH at step ``before_commit`` (inside the
open transaction) and sleeps there until it is killed.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from headrace import Computation
from headrace.engine import DedupCache, InputRecord, ShardBatch, run_shard_batch, shard_of
from headrace.model import ComputationOptions
from headrace.store import open_store

NAME = "counter"
SHARDS = 4
KEYS = 200
RECORDS = 2000  # per batch
STREAM = "counted"


def key_of(i: int) -> str:
    return f"key-{i % KEYS}"


def record_id(batch: int, i: int) -> str:
    """Half the ids positional, as an injector gives them (kept as ranges), half arbitrary (kept exactly)."""
    return f"inject:in:{batch}:{i}" if i % 2 else f"in-{batch}-{i}"


def records_of(batch: int) -> dict[int, list[InputRecord]]:
    """Batch ``batch``'s input records by shard: deterministic, so every restart sees the same batch."""
    by_shard: dict[int, list[InputRecord]] = {s: [] for s in range(SHARDS)}
    for i in range(RECORDS):
        key = key_of(i)
        by_shard[shard_of(key, SHARDS)].append(InputRecord("in", key, i, batch * 10_000 + i, record_id(batch, i)))
    return by_shard


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce(STREAM, record.id, key=ctx.key)


def main(url: str, batches: int, stall: str | None = None, marker: str | None = None) -> None:
    store = open_store(url)
    store.register(NAME, SHARDS)
    sequencer = store.acquire_writer(NAME)
    options = ComputationOptions.from_kwargs(NAME, {"shards": SHARDS})
    now = {"at": (0, 0)}
    if stall is not None:
        stall_at = tuple(int(n) for n in stall.split(":"))

        def failpoint(step: str) -> None:
            if step == "before_commit" and now["at"] == stall_at:
                with open(marker, "w") as f:  # type: ignore[arg-type]
                    f.write(step)
                time.sleep(3600)

        store.failpoint = failpoint
    latest = store.latest_batch(NAME)
    first = latest.batch + 1 if latest else 1
    print("ready", first, flush=True)
    computation, cache = Count(), DedupCache()
    for batch in range(first, batches + 1):
        for shard, records in records_of(batch).items():
            now["at"] = (batch, shard)
            run_shard_batch(computation, NAME, options, None, store,
                            ShardBatch(NAME, shard, batch, records, 0, 0, 0, sequencer, frozenset({"in"})), cache)
        store.complete_batch(NAME, batch, 0, 0, sequencer)
    store.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:5])
    os._exit(0)
