"""Live rebalancing in continuous mode (docs/architecture.md §4.2, "Rebalancing"): all the load
starts on one interval of two while the other worker idles; without a restart of the topology
the driver splits the hot interval's computation and moves intervals until the workers' loads are
within 2x of each other, and the outputs are exact. The splits and merges under kills are
tests/chaos/test_chaos.py's (``test_chaos_rescaling_while_running``)."""

from __future__ import annotations

import json
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from headrace import Computation, Topology, injectors, key_by, read, status
from headrace.monitor.show import status_text
from headrace.names import meta
from headrace.spark.continuous import ContinuousRunner
from headrace.spark.rebalancing import REBALANCED
from headrace.store import open_store

RATE, SECONDS = 600, 25  # the input still flows when the 20 s to spread are up (it spread in 7.5 s here)


def hot_keys() -> list[str]:
    """Keys all in interval 0 of 2, spread over intervals 0 and 2 of 4."""
    keys, i = [], 0
    while len(keys) < 12:
        key = f"k{i}"
        if zlib.crc32(key.encode()) % 2 == 0:
            keys.append(key)
        i += 1
    assert {zlib.crc32(k.encode()) % 4 for k in keys} == {0, 2}
    return keys


KEYS = hot_keys()


class CountPerKey(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("end", 10**15)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("counts", {"key": ctx.key, "n": ctx.state})


def event(i: int) -> dict[str, Any]:
    return {"key": KEYS[i % len(KEYS)], "ts": 1_800_000_000_000 + i}


def worker_rates(store: Any, run: str, topology: str) -> dict[str, float]:
    """Records/s each live worker reported in its last lease round."""
    out = {}
    for key, text in store.metas(meta.load(topology, run)).items():
        report = json.loads(text)
        out[meta.parse_worker(key.replace(meta.LOAD, meta.WORKER, 1))[2]] = (
            sum(n for n, _ in report["intervals"].values()) / max(0.001, (report["at"] - report["since"]) / 1000))
    return out


def test_a_hot_interval_is_split_and_its_halves_spread_over_the_workers(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    count = RATE * SECONDS
    t = Topology("hot")
    t.inject("events", injectors.generator(event, count=count, timestamp="ts", rate=RATE, batch_size=30,
                                           max_delay_ms=0))
    t.add(CountPerKey, inputs={"events": key_by("key")}, outputs=["counts"], shards=2)
    runner = ContinuousRunner(t, url, spark=spark, workers=2, progress=None, rebalance_every_s=2.0)
    runner.start()
    store = open_store(url)
    try:
        deadline, spread = time.time() + 20, None
        while time.time() < deadline:
            runner.check()
            rates = worker_rates(store, runner.run_id, "hot")
            if len(rates) == 2 and min(rates.values()) > 0 and max(rates.values()) <= 2 * min(rates.values()):
                spread = rates
                break
            time.sleep(0.5)
        decisions = [json.loads(e.detail) for e in store.events(kinds=[REBALANCED])]
        assert spread is not None, f"the load did not spread within 20 s: {worker_rates(store, runner.run_id, 'hot')}, " \
                                   f"decisions {decisions}"
        assert any(d["kind"] == "rescale" and d["computation"] == "CountPerKey" for d in decisions), decisions
        runner.wait(timeout_s=300)
    finally:
        runner.stop()
    got = {r.value["key"]: r.value["n"] for r in read("counts", url)}
    assert got == dict(Counter(event(i)["key"] for i in range(count)))
    assert store.computations()["CountPerKey"] >= 4
    store.close()
    shown = status(url)  # what the rebalancer did shows in headrace status (and the dashboard, which reads it)
    assert any(d["kind"] == "rescale" and d["new"] >= 4 for d in shown["rebalanced"]), shown["rebalanced"]
    assert "rescaled CountPerKey from 2 to 4 intervals" in status_text(shown)
