"""End-to-end latency and watermark lag of a three-stage pipeline on local Spark.

    .venv/bin/python bench/pipeline_latency.py [--rate 2000] [--seconds 30]

Each record carries the wall-clock time it was injected; the last stage notes when it processed
it. Run twice in the same invocation: exactly-once with strong productions (the default), and
at-least-once with weak productions (the paper's cheaper setting). Also reports every stage's
low-watermark lag behind the injector (wall-clock ms, from the journal) and peak memory. A short
warm-up run goes first, and the first ``--settle`` seconds of each run (queries starting) are left
out of the percentiles.
"""

from __future__ import annotations

import argparse
import bisect
import os
import platform
import resource
import tempfile
import time
from typing import Any

from headrace import Computation, Topology, injectors, key_by, read, run
from headrace.spark.session import spark_session
from headrace.store import open_store

STAGES = ["First", "Second", "Third"]


class PassOn(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce(self.output, record.value)

    output = ""


class First(PassOn):
    output = "s1"


class Second(PassOn):
    output = "s2"


class Third(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("delivered", {"sent": record.value["sent"], "seen": time.time() * 1000})


def build(rate: float, seconds: float, name: str, **options: Any) -> Topology:
    count = int(rate * seconds)

    def make(i: int) -> dict[str, Any]:
        return {"user": f"u{i % 997}", "item": f"i{i % 613}", "n": i, "sent": time.time() * 1000,
                "ts": int(time.time() * 1000)}

    t = Topology(name)
    t.inject("events", injectors.generator(make, count, timestamp="ts", rate=rate, batch_size=max(1, int(rate / 10)),
                                           max_delay_ms=0))
    t.add(First, inputs={"events": key_by("user")}, outputs=["s1"], **options)
    t.add(Second, inputs={"s1": key_by("item")}, outputs=["s2"], **options)
    t.add(Third, inputs={"s2": key_by("user")}, outputs=["delivered"], **options)
    return t


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def watermark_lags(store_url: str, settled_ms: float) -> dict[str, list[float]]:
    store = open_store(store_url)
    injected = store.batches("inject:events")
    marks = [b.output_watermark for b in injected]
    lags: dict[str, list[float]] = {}
    for stage in STAGES:
        lags[stage] = []
        for b in store.batches(stage):
            i = bisect.bisect_right(marks, b.input_watermark) - 1
            if i >= 0 and injected[i].output_watermark < 2**62 and injected[i].completed_at >= settled_ms:
                lags[stage].append(b.completed_at - injected[i].completed_at)
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2_000, help="records injected per second")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--settle", type=float, default=8, help="seconds at the start of each run left out (start-up)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.rate:,.0f} records/s for {args.seconds:.0f} s through three stages on Spark {args.master}")
    spark = spark_session(args.master)
    warm = tempfile.mkdtemp(prefix="headrace-latency-warm-")
    run(build(args.rate, 5, "latency_warm_up"), store=f"sqlite:///{warm}/store.db", spark=spark, progress=None,
        trigger_ms=50)  # the JVM's and the workers' start-up, outside both measured runs
    variants = [("exactly-once, strong productions", "strong", {}),
                ("at-least-once, weak productions", "weak", {"semantics": "at_least_once", "productions": "weak"})]
    print(f"{'variant':<36} {'measured':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}   watermark lag p50 per stage (ms)")
    for label, tag, options in variants:
        folder = tempfile.mkdtemp(prefix="headrace-latency-")
        url = f"sqlite:///{folder}/store.db"
        run(build(args.rate, args.seconds, f"latency_{tag}", **options), store=url, spark=spark, progress=None,
            trigger_ms=50)
        delivered = read("delivered", url)
        settled = min(r.value["sent"] for r in delivered) + args.settle * 1000
        latencies = [r.value["seen"] - r.value["sent"] for r in delivered if r.value["sent"] >= settled]
        lags = watermark_lags(url, settled)
        lag_text = ", ".join(f"{s} {pct(lags[s], 0.5):,.0f}" for s in STAGES)
        print(f"{label:<36} {len(latencies):>8,} {pct(latencies, .5):>8,.0f} {pct(latencies, .95):>8,.0f} "
              f"{pct(latencies, .99):>8,.0f}   {lag_text}")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    others = peak_rss_of_descendants(os.getpid())
    print(f"peak memory (VmHWM): Python driver {peak_mb:,.0f} MB; " +
          ", ".join(f"{name} {mb:,.0f} MB" for name, mb in others))
    spark.stop()


def peak_rss_of_descendants(root: int) -> list[tuple[str, float]]:
    """Peak resident memory of every live descendant (the JVM, Python workers), from /proc."""
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        try:
            children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            continue
        for child in map(int, children):
            stack.append(child)
            try:
                status = dict(line.split(":", 1) for line in open(f"/proc/{child}/status").read().splitlines()
                              if ":" in line)
                name = "JVM" if "java" in status["Name"] else status["Name"].strip()
                if name not in ("JVM", "python", "python3"):
                    continue
                out.append((name, int(status["VmHWM"].split()[0]) / 1024))
            except (OSError, KeyError, ValueError):
                continue
    return out


if __name__ == "__main__":
    main()
