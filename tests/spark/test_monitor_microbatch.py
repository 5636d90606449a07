"""``headrace status`` in micro-batch mode, on a run of its own: the continuous run that
test_monitor.py shares holds every task slot of local[2] until that module ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import headrace
from headrace.store import open_store

from .pipelines import searches, three_stage
from .test_monitor import THREE_STAGES, cli, journaled


def test_in_microbatch_mode_status_reads_the_positions_from_spark_offsets_and_the_backlog_drains(
        spark: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    events = searches(300, seed=8)
    headrace.run(three_stage(events, batch_size=100, name="watched_mb"), store=url, spark=spark, progress=None,
                 mode="microbatch", timeout_s=240)
    report = json.loads(cli("status", "--json", "--store", url))
    assert report["topologies"][0]["mode"] == "microbatch"
    for name in THREE_STAGES:
        stage = report["stages"][name]
        assert (stage["input_watermark"], stage["output_watermark"]) == journaled(url, name)[-1]
        assert (stage["backlog_records"], stage["backlog_batches"]) == (0, 0), name
    assert report["stages"]["WindowCounter"]["records"] == len(events)
    store = open_store(url)
    try:  # the driver copied every batch's end offset: the last one is each producer's head
        read = store.all_positions("BucketTotals")[-1]
        assert read == {"WindowCounter": store.latest_batch("WindowCounter").batch}  # type: ignore[union-attr]
    finally:
        store.close()
