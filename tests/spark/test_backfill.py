"""Backfill: the same topology over historical files, then on from a live generator while it runs,
gives every window the output one live run over all the events gives (the oracle)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from headrace import Topology, injectors, key_by, read, run
from headrace.store import open_store

from .pipelines import WindowCounter, oracle, searches

DISORDER_MS = 2_000


def test_a_backfill_from_files_switches_to_a_live_generator_with_no_gap_and_no_duplicate(
        spark: Any, store_url: str, tmp_path: Path, mode: str) -> None:
    events = searches(3_000, seed=17, disorder_ms=DISORDER_MS)
    switch_at = sorted(e["ts"] for e in events)[len(events) // 2]
    # the archive runs a little past the switch, and the live source starts a little before it
    archived = [e for e in events if e["ts"] < switch_at + 3_000]
    start = min(i for i, e in enumerate(events) if e["ts"] >= switch_at - 3_000)
    archive = tmp_path / "archive"
    archive.mkdir()
    for n, i in enumerate(range(0, len(archived), 500)):
        path = archive / f"part-{n:03d}.jsonl"
        path.write_text("\n".join(json.dumps(e) for e in archived[i:i + 500]))
        os.utime(path, (1_000_000 + n, 1_000_000 + n))  # files are read in mtime order
    live = events[start:]

    def make(i: int) -> dict[str, Any]:
        if i == 0:  # the live source begins once the pipeline has put out windows of the history
            deadline = time.time() + 120
            while not any(True for _ in read("window_counts", store_url)):
                assert time.time() < deadline, "no window of the history came out"
                time.sleep(0.05)
        return live[i]

    t = Topology("backfill")
    t.inject("searches", injectors.backfill(
        injectors.files(str(archive), timestamp="ts", bounded=True),
        injectors.generator(make, count=len(live), timestamp="ts", rate=400, batch_size=50,
                            max_delay_ms=DISORDER_MS),
        switch_at=switch_at, max_delay_ms=DISORDER_MS))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)

    produced = [((r.value["query"], r.value["bucket"]), r.value["count"]) for r in read("window_counts", store_url)]
    assert dict(produced) == oracle(events)["window_counts"]
    assert len(produced) == len(dict(produced)), "a window emitted twice"

    # the switch happened with the pipeline running: windows of the history were out before the
    # live generator published (make(0) waits for them), and the run went on to the end
    store = open_store(store_url)
    published = [b.completed_at for b in store.batches("inject:searches")]
    with_output = {(p, b) for p in store.stream_producers("window_counts")
                   for b, _ in store.read_segments("window_counts", p, 0, 10**9)}
    first_output = min(b.completed_at for p in store.stream_producers("window_counts") for b in store.batches(p)
                       if (p, b.batch) in with_output)
    assert sum(t > first_output for t in published) >= len(live) // 50, "the live batches came after the output"
