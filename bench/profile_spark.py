"""Where the time goes when headrace counts keys on Spark: py-spy samples the driver and every
Python worker Spark starts, and this script sums the samples by function.

    .venv/bin/python bench/profile_spark.py [--records 500000] [--keys 50000]

It runs ``bench/spark_keyed_count.py --skip-tws`` under ``py-spy record --subprocesses`` (raw
collapsed stacks), then prints, for the Python workers and for the driver separately, the share of
samples spent inside each headrace function (inclusive) and the leaf functions that take most
samples (self). The JVM is not sampled: its share is what the Python processes spend waiting.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+)(?::\d+)?\)$")


def parse(path: str) -> list[tuple[list[str], int]]:
    stacks = []
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                stacks.append((stack.split(";"), int(count)))
    return stacks


HEADRACE_FILES = {f for _, _, files in os.walk(os.path.join(HERE, "..", "src", "headrace")) for f in files
                  if f.endswith(".py")}
PROCESS = re.compile(r'^process \d+:"(?P<cmd>.*)"$')


def label(frame: str) -> str:
    m = FRAME.match(frame)
    return f"{os.path.basename(m['file'])}:{m['func']}" if m else frame


def is_headrace(frame: str) -> bool:
    m = FRAME.match(frame)
    return m is not None and os.path.basename(m["file"]) in HEADRACE_FILES


def process_kind(stack: list[str]) -> str:
    """py-spy puts the process tree on top of each stack; the innermost process says what it is."""
    commands = [m["cmd"] for m in map(PROCESS.match, stack) if m]
    cmd = commands[-1] if commands else ""
    if "pyspark.worker" in cmd:
        return "Spark's Python workers (source reads, keying, shard tasks)"
    if "python_streaming_source_runner" in cmd:
        return "the streaming source runners (offsets, partitions)"
    if len(commands) == 1:
        return "the driver (injectors, foreachBatch, journal)"
    return "other Spark helper processes"


def report(title: str, stacks: list[tuple[list[str], int]], top: int) -> None:
    total = sum(c for _, c in stacks)
    if not total:
        return
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for stack, count in stacks:
        for name in {label(f) for f in stack if is_headrace(f)}:
            inclusive[name] += count
        leaf[label(stack[-1])] += count
    print(f"\n{title}: {total:,} samples")
    print("  inside headrace functions (inclusive):")
    for name, count in inclusive.most_common(top):
        print(f"    {100 * count / total:5.1f}%  {name}")
    print("  leaf functions (self):")
    for name, count in leaf.most_common(top):
        print(f"    {100 * count / total:5.1f}%  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--stacks", help="summarize this raw stacks file instead of running the benchmark")
    args = parser.parse_args()
    if args.stacks:
        summarize(parse(args.stacks), args.top)
        return
    raw = os.path.join(tempfile.mkdtemp(prefix="headrace-profile-"), "stacks.txt")
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    subprocess.run([py_spy, "record", "--subprocesses", "--nonblocking", "--format", "raw", "--rate", str(args.rate),
                    "-o", raw, "--", sys.executable, os.path.join(HERE, "spark_keyed_count.py"), "--skip-tws", "--skip-weak",
                    "--records", str(args.records), "--keys", str(args.keys)], check=True)
    summarize(parse(raw), args.top)
    print(f"\nraw stacks: {raw}")


def summarize(stacks: list[tuple[list[str], int]], top: int) -> None:
    kinds: dict[str, list[tuple[list[str], int]]] = {}
    for stack, count in stacks:
        kinds.setdefault(process_kind(stack), []).append((stack, count))
    total = sum(c for _, c in stacks)
    for kind, part in sorted(kinds.items(), key=lambda kv: -sum(c for _, c in kv[1])):
        print(f"{100 * sum(c for _, c in part) / total:5.1f}% of samples: {kind}")
    for kind, part in sorted(kinds.items(), key=lambda kv: -sum(c for _, c in kv[1]))[:3]:
        report(kind, part, top)


if __name__ == "__main__":
    main()
