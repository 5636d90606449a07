"""The first record after an idle spell: how long it takes to cross each hop of a continuous
pipeline whose workers have had nothing to do (issue 21: under 10 ms per hop on PostgreSQL).

    .venv/bin/python bench/idle.py [--store sqlite,postgresql] [--store-url URL] [--idle-s 30] [--probes 3]

Two keyed stages (First by user, then Second by user) in continuous mode, exactly-once, strong
productions, 4 intervals each, ``local[2]``. The injector publishes ``--warm`` records, then, for
each probe, waits ``--idle-s`` seconds (nothing is injected: the workers sleep on PostgreSQL's
``LISTEN`` and back off on SQLite) and publishes one record in a batch of its own. A hop is
measured as ``pipeline_latency.py`` measures it: from the journal's ``completed_at`` of the batch
that holds the record (the injector's publish, then First's interval commit) to the moment the
consumer's ``process_record`` sees it. Each store runs in turn in one run, PostgreSQL on a server
started for the run (the tests' ``tests/postgres_server.py``) unless ``--store-url`` names one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Iterator

from pyspark import cloudpickle
import pipeline_latency
from pipeline_latency import producer_batch, read_sightings, stage_class, start_postgres, store_url

from headrace import Topology, injectors, key_by, run
from headrace.spark.session import spark_session
from headrace.store import open_store

TARGET_MS = 10.0
HOPS = [("inject→First", "First"), ("First→Second", "Second")]
cloudpickle.register_pickle_by_value(pipeline_latency)  # Spark's workers do not have bench/ on their path


class Spells:
    """The injector's values: ``warm`` records, then per probe an idle spell and one record."""

    def __init__(self, warm: int, probes: int, idle_s: float) -> None:
        self.warm, self.probes, self.idle_s = warm, probes, idle_s

    def __call__(self) -> Iterator[dict[str, Any]]:
        for n in range(self.warm):
            yield {"user": f"u{n % 7}", "n": n, "ts": int(time.time() * 1000)}
        for k in range(self.probes):
            time.sleep(self.idle_s)  # the spell itself: no record, no timer, nothing for a worker to do
            yield {"user": f"probe{k}", "n": self.warm + k, "ts": int(time.time() * 1000)}


def build(name: str, log_dir: str, spells: Spells) -> Topology:
    t = Topology(name)
    t.inject("events", injectors.records(spells, timestamp="ts", batch_size=1))
    t.add(stage_class("First", "s1", log_dir), name="First", inputs={"events": key_by("user")}, outputs=["s1"],
          shards=4)
    t.add(stage_class("Second", None, log_dir), name="Second", inputs={"s1": key_by("user")}, shards=4)
    return t


def probe_hops(url: str, log_dir: str, warm: int) -> list[dict[str, float]]:
    """Per probe (in order), each hop's latency in ms."""
    seen = read_sightings(log_dir)
    store = open_store(url)
    try:
        journals: dict[str, dict[int, float]] = {}  # producer -> batch -> completed_at, each read once
        out: list[dict[str, float]] = []
        for n in sorted(n for n, _ in seen["First"].values() if n >= warm):
            hops: dict[str, float] = {}
            for hop, stage in HOPS:
                rid, at = next((rid, at) for rid, (m, at) in seen[stage].items() if m == n)
                producer, batch = producer_batch(rid, "continuous")
                if producer not in journals:
                    journals[producer] = {b.batch: b.completed_at for b in store.batches(producer)}
                hops[hop] = at - journals[producer][batch]
            out.append(hops)
        return out
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--store-url", help="a PostgreSQL server's admin URL (else a server is started)")
    parser.add_argument("--idle-s", type=float, default=30.0, help="seconds of no input before each probe")
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--warm", type=int, default=200, help="records through both stages before the first spell")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    stores = [s.strip() for s in args.store.split(",") if s.strip()]
    for s in stores:
        if s not in ("sqlite", "postgresql"):
            parser.error(f"unknown store {s!r}: use sqlite, postgresql")
    print(f"idle: two keyed stages, continuous mode, exactly-once, 4 intervals each, Spark {args.master}; "
          f"{args.warm} records, then {args.probes} probes each after {args.idle_s:.0f} s without input")
    spark = spark_session(args.master)
    server = start_postgres(args.store_url) if "postgresql" in stores else None
    worst: dict[str, float] = {}
    try:
        print(f"{'store':<11} {'probe':>5} " + " ".join(f"{hop + ' ms':>17}" for hop, _ in HOPS))
        for store in stores:
            folder = tempfile.mkdtemp(prefix=f"headrace-idle-{store}-")
            url = store_url(store, folder, server)
            run(build(f"idle_{store}", folder, Spells(args.warm, args.probes, args.idle_s)), store=url, spark=spark,
                progress=None, mode="continuous")
            measured = probe_hops(url, folder, args.warm)
            if len(measured) != args.probes:
                raise SystemExit(f"{store}: {len(measured)} of {args.probes} probes reached First ({folder})")
            for k, hops in enumerate(measured, 1):
                print(f"{store:<11} {k:>5} " + " ".join(f"{hops[hop]:>17.1f}" for hop, _ in HOPS), flush=True)
            worst[store] = max(v for hops in measured for v in hops.values())
    finally:
        if server is not None:
            server.stop()
        spark.stop()
    for store, ms in worst.items():
        met = "met" if ms < TARGET_MS else "NOT met"
        ratio = f" ({ms / worst['sqlite']:.2f}x SQLite's in this run)" if store != "sqlite" and "sqlite" in worst else ""
        print(f"{store}: worst hop of a record after an idle spell {ms:.1f} ms{ratio}; "
              f"target under {TARGET_MS:.0f} ms per hop: {met}")


if __name__ == "__main__":
    main()
