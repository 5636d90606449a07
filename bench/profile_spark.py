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


def label(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    file = m["file"]
    for marker in ("/headrace/", "/pyspark/", "/pyarrow/", "/bench/"):
        if marker in file:
            return f"{marker.strip('/')}/{file.split(marker, 1)[1]}:{m['func']}"
    return f"{os.path.basename(file)}:{m['func']}"


def is_worker(stack: list[str]) -> bool:
    return any("pyspark/daemon.py" in f or "pyspark/worker.py" in f for f in stack)


def report(title: str, stacks: list[tuple[list[str], int]], top: int) -> None:
    total = sum(c for _, c in stacks)
    if not total:
        return
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for stack, count in stacks:
        for name in {label(f) for f in stack if "/headrace/" in f}:
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
    args = parser.parse_args()
    raw = os.path.join(tempfile.mkdtemp(prefix="headrace-profile-"), "stacks.txt")
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    subprocess.run([py_spy, "record", "--subprocesses", "--nonblocking", "--format", "raw", "--rate", str(args.rate),
                    "-o", raw, "--", sys.executable, os.path.join(HERE, "spark_keyed_count.py"), "--skip-tws", "--skip-weak",
                    "--records", str(args.records), "--keys", str(args.keys)], check=True)
    stacks = parse(raw)
    report("Spark's Python workers", [(s, c) for s, c in stacks if is_worker(s)], args.top)
    report("the driver", [(s, c) for s, c in stacks if not is_worker(s)], args.top)
    print(f"\nraw stacks: {raw}")


if __name__ == "__main__":
    main()
