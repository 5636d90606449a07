"""The process test_semantics_under_kills.py kills: a keyed counter that produces one record per
input, with the state and output semantics it is given, killing itself with SIGKILL at one
commit step.

    python semantics_child.py URL STATE_SEMANTICS OUTPUT_SEMANTICS [STEP OCCURRENCE]

It resumes after the last journaled batch, as a driver does, and prints ``done`` when every
batch is committed. With STEP, the OCCURRENCE-th time this process reaches that commit step
(``headrace.store.COMMIT_STEPS``), it sends itself SIGKILL: a real crash at a chosen point.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from headrace import Computation
from headrace.engine import DedupCache, InputRecord, ShardBatch, run_shard_batch, shard_of
from headrace.model import ComputationOptions
from headrace.store import open_store

NAME = "counter"
SHARDS = 2
KEYS = 5
RECORDS = 20  # per batch
BATCHES = 8
STREAM = "counted"


def key_of(i: int) -> str:
    return f"key-{i % KEYS}"


def records_of(batch: int) -> dict[int, list[InputRecord]]:
    by_shard: dict[int, list[InputRecord]] = {s: [] for s in range(SHARDS)}
    for i in range(RECORDS):
        key = key_of(i)
        by_shard[shard_of(key, SHARDS)].append(InputRecord("in", key, i, batch * 1_000 + i, f"in-{batch}-{i}"))
    return by_shard


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce(STREAM, record.id, key=ctx.key)


def main(url: str, state: str, output: str, step: str | None = None, occurrence: str | None = None) -> None:
    store = open_store(url)
    store.register(NAME, SHARDS)
    sequencer = store.acquire_writer(NAME)
    options = ComputationOptions.from_kwargs(NAME, {"shards": SHARDS, "state_semantics": state,
                                                    "output_semantics": output})
    if step is not None:
        seen = {"n": 0}

        def failpoint(at: str) -> None:
            if at == step:
                seen["n"] += 1
                if seen["n"] == int(occurrence or 1):
                    os.kill(os.getpid(), signal.SIGKILL)

        store.failpoint = failpoint
    latest = store.latest_batch(NAME)
    computation, cache = Count(), DedupCache()
    for batch in range((latest.batch if latest else 0) + 1, BATCHES + 1):
        for shard, records in records_of(batch).items():
            run_shard_batch(computation, NAME, options, None, store,
                            ShardBatch(NAME, shard, batch, records, 0, 0, 0, sequencer, frozenset({"in"})), cache)
        store.complete_batch(NAME, batch, 0, 0, sequencer)
    store.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
