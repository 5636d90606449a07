"""The Zeitgeist anomaly detector (MillWheel section 2) on local Spark with the embedded SQLite store.

    python -m examples.zeitgeist.job            # run (or resume) the default scenario
    python -m examples.zeitgeist.job --fresh    # start over
    python -m examples.zeitgeist.job --kafka    # searches from a Kafka topic, anomalies to one (a fresh run)

Stop it with Ctrl-C and run the same command again: it resumes where it stopped.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Sequence

from headrace import Topology, injectors, key_by, read
from headrace.dashboard import Dashboard
from headrace.store import open_store

from .computations import DipDetector, ModelCalculator, SpikeDetector, WindowCounter
from .traffic import Anomaly, Scenario, generate

STAGES = ["WindowCounter", "ModelCalculator", "SpikeDetector", "DipDetector"]


def build(scenario: Scenario, rate: float | None = 6_000, batch_size: int = 1_000, source: Any = None) -> Topology:
    events = scenario.events
    t = Topology("zeitgeist")
    # an iterator (not a list): the injector promises only max_delay_ms of disorder, as a live
    # source would, so the records generated later than that arrive late
    t.inject("searches", source or injectors.records(lambda: iter(events), timestamp="ts", batch_size=batch_size,
                                                     rate=rate, max_delay_ms=scenario.disorder_ms))
    t.add(WindowCounter, inputs={"searches": key_by("query")}, outputs=["window_counts"], shards=2)
    t.add(ModelCalculator, inputs={"window_counts": key_by("query")}, outputs=["scored"], shards=2)
    t.add(SpikeDetector, inputs={"scored": key_by("query")}, outputs=["anomalies"], shards=2)
    t.add(DipDetector, inputs={"scored": key_by("query")}, outputs=["anomalies"], shards=2)
    return t


def score(found: Sequence[dict[str, Any]], truth: Sequence[Anomaly]) -> tuple[float, float, list[dict[str, Any]]]:
    """Precision and recall: a detection matches a true anomaly of its kind and query whose
    interval (one bucket of slack on either side) contains the detected bucket."""
    def matches(d: dict[str, Any], a: Anomaly) -> bool:
        return d["kind"] == a.kind and d["query"] == a.query and a.start - 1000 <= d["bucket"] < a.end + 1000

    true_positive = [d for d in found if any(matches(d, a) for a in truth)]
    recalled = [a for a in truth if any(matches(d, a) for d in found)]
    precision = len(true_positive) / len(found) if found else 0.0
    recall = len(recalled) / len(truth) if truth else 1.0
    return precision, recall, [d for d in found if d not in true_positive]


def percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return f"p50 {pick(0.5):,.0f} ms, p95 {pick(0.95):,.0f} ms, p99 {pick(0.99):,.0f} ms"


def lag_report(store_url: str, since_ms: int) -> tuple[dict[str, list[float]], list[float]]:
    """Watermark lag per stage and end-to-end latency, both in wall-clock ms, from the journal.

    A stage's lag at one of its batches: how long before that batch the injector had published
    the watermark the stage has now reached. End-to-end latency of an injected batch: from its
    publication until every stage's input watermark has passed it (all its records processed).
    """
    store = open_store(store_url)
    injected = [b for b in store.batches("inject:searches") if b.completed_at >= since_ms]
    journals = {stage: store.batches(stage) for stage in STAGES}
    store.close()
    lags: dict[str, list[float]] = {}
    marks = [b.output_watermark for b in injected]
    for stage, journal in journals.items():
        lags[stage] = []
        for b in journal:
            i = bisect.bisect_right(marks, b.input_watermark) - 1
            if i >= 0 and b.completed_at >= since_ms and injected[i].output_watermark < 2**63 - 1:
                lags[stage].append(b.completed_at - injected[i].completed_at)
    end_to_end: list[float] = []
    for b in injected[:-1]:
        done = [next((s.completed_at for s in journals[stage] if s.input_watermark >= b.output_watermark), None)
                for stage in ("SpikeDetector", "DipDetector")]
        finished = [d for d in done if d is not None]
        if len(finished) == len(done):
            end_to_end.append(max(finished) - b.completed_at)
    return lags, end_to_end


class AnomalyWatcher(threading.Thread):
    """Shows anomalies as they are committed and keeps the JSON-lines file equal to the stream."""

    def __init__(self, store_url: str, path: str, out: Any):
        super().__init__(daemon=True, name="zeitgeist-anomalies")
        self.store_url, self.path, self.out = store_url, path, out
        self.shown: set[str] = set()
        self.stop_event = threading.Event()

    def poll(self) -> list[dict[str, Any]]:
        records = list(read("anomalies", self.store_url))
        with open(self.path + ".tmp", "w") as f:
            for r in records:
                f.write(json.dumps(r.value) + "\n")
        os.replace(self.path + ".tmp", self.path)
        for r in records:
            if r.id not in self.shown:
                self.shown.add(r.id)
                v = r.value
                stamp = time.strftime("%H:%M:%S", time.gmtime(v["bucket"] / 1000))
                print(f"  anomaly: {v['kind']:<5} {v['query']} at {stamp} (count {v['count']}, "
                      f"expected {v['expected']})", file=self.out, flush=True)
        return [r.value for r in records]

    def run(self) -> None:
        while not self.stop_event.wait(2.0):
            try:
                self.poll()
            except Exception:  # the store may be busy; the next poll catches up
                pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="runs/zeitgeist", help="where the store, checkpoints and output go")
    parser.add_argument("--fresh", action="store_true", help="delete the previous run and start over")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rate", type=float, default=6_000, help="records injected per wall-clock second")
    parser.add_argument("--mode", default="continuous", choices=["continuous", "microbatch"],
                        help="continuous (default): long-lived workers; microbatch: a Spark query per computation")
    parser.add_argument("--dashboard-port", type=int, default=0, help="the web dashboard's port (0: a free one)")
    parser.add_argument("--kafka", action="store_true", help="start a Kafka broker; read the searches from a topic "
                                                             "and write the anomalies to one (always a fresh run)")
    args = parser.parse_args(argv)

    if (args.fresh or args.kafka) and os.path.exists(args.dir):
        shutil.rmtree(args.dir)
    os.makedirs(args.dir, exist_ok=True)
    store_url = f"sqlite:///{os.path.abspath(args.dir)}/store.db"
    scenario = generate(Scenario(days=args.days, queries=args.queries))
    with open(os.path.join(args.dir, "truth.json"), "w") as f:
        json.dump([asdict(a) for a in scenario.truth], f, indent=1)
    print(f"zeitgeist: {len(scenario.events):,} searches over {scenario.queries} queries, {scenario.days} simulated "
          f"days; {len(scenario.truth)} injected anomalies; store {store_url}", flush=True)

    from headrace.spark.continuous import ContinuousRunner
    from headrace.spark.runner import SparkRunner

    broker = None
    topology = build(scenario, rate=args.rate)
    if args.kafka:
        from . import kafka

        broker = kafka.start_broker()
        assert broker.bootstrap_servers is not None
        kafka.fill(broker.bootstrap_servers, scenario.events)
        print(f"zeitgeist: Kafka broker at {broker.bootstrap_servers}; {len(scenario.events):,} searches in topic "
              f"{kafka.SEARCHES!r}, anomalies go to topic {kafka.ANOMALIES!r}", flush=True)
        topology = build(scenario, source=kafka.source(broker.bootstrap_servers, scenario.disorder_ms))
        kafka.sink(topology, broker.bootstrap_servers)
    started_ms = int(time.time() * 1000)
    watcher = AnomalyWatcher(store_url, os.path.join(args.dir, "anomalies.jsonl"), sys.stdout)
    make = ContinuousRunner if args.mode == "continuous" else SparkRunner
    runner = make(topology, store_url, args.master, progress=sys.stderr, progress_every_s=5.0)
    dashboard = Dashboard(store_url, port=args.dashboard_port)
    try:
        runner.start()
        dashboard.start()
        print(f"zeitgeist: dashboard at {dashboard.url} while it runs", flush=True)
        watcher.start()
        result = runner.wait()
    except KeyboardInterrupt:
        print("\nzeitgeist: stopped; run the same command again to resume where it stopped", file=sys.stderr)
        return 130
    finally:
        watcher.stop_event.set()
        runner.stop()
        dashboard.stop()
        published = kafka.read_anomalies(broker.bootstrap_servers) if broker and broker.bootstrap_servers else None
        if broker is not None:
            broker.stop()
    found = watcher.poll()

    store = open_store(store_url)
    counters = store.counters("WindowCounter")
    store.close()
    precision, recall, false_alarms = score(found, scenario.truth)
    lags, end_to_end = lag_report(store_url, started_ms)
    processed = counters.get("records", 0)
    this_run = result.stats["WindowCounter"].counters.get("records", 0)
    print("\n=== zeitgeist summary ===")
    print(f"anomalies found      {len(found)} ({sum(d['kind'] == 'spike' for d in found)} spikes, "
          f"{sum(d['kind'] == 'dip' for d in found)} dips) of {len(scenario.truth)} injected; "
          f"written to {os.path.join(args.dir, 'anomalies.jsonl')}")
    print(f"precision            {precision:.2f}")
    print(f"recall               {recall:.2f}")
    for d in false_alarms:
        print(f"  false alarm: {d}")
    print(f"records processed    {processed:,} in total, {this_run:,} in this run")
    print(f"throughput           {this_run / result.elapsed_s:,.0f} records/s over {result.elapsed_s:.1f} s "
          f"(wall clock, Spark start-up included)")
    print(f"end-to-end latency   {percentiles(end_to_end)} (injected until every stage has processed it)")
    for stage in STAGES:
        print(f"watermark lag        {stage:<16} {percentiles(lags[stage])}")
    print(f"late records dropped {counters.get('late_dropped', 0):,} (the generator made {scenario.late_records:,} "
          f"arrive late; those behind the low watermark on arrival are dropped)")
    if published is not None:
        same = sorted(map(json.dumps, published)) == sorted(map(json.dumps, found))
        print(f"kafka topic          {len(published)} anomalies read from {kafka.ANOMALIES!r} by a read_committed "
              f"consumer; {'the same as' if same else 'NOT the same as'} the store's stream")
    print(f"dashboard            headrace dashboard --store {store_url}   (the run's history, state and timers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
