"""The trending-events example (Facebook paper, section 3) on local Spark with the SQLite store.

    python -m examples.trending.job [--dir runs/trending] [--fresh]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any, Sequence

from headrace import Topology, injectors, key_by, read, run

from .computations import Filterer, Joiner, Ranker, Scorer, oracle
from .events import generate


def build(events: list[dict[str, Any]], batch_size: int = 1_000, rate: float | None = None) -> Topology:
    t = Topology("trending")
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=batch_size, rate=rate))
    t.add(Filterer, inputs={"events": key_by("id")}, outputs=["filtered"], shards=2)
    t.add(Joiner, inputs={"filtered": key_by("dim")}, outputs=["joined"], shards=2)
    t.add(Scorer, inputs={"joined": key_by(lambda v: f"{v['topic']}|{v['event']}")}, outputs=["scores"], shards=2)
    t.add(Ranker, inputs={"scores": key_by("topic")}, outputs=["trending"], shards=2)
    return t


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="runs/trending")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.fresh and os.path.exists(args.dir):
        shutil.rmtree(args.dir)
    os.makedirs(args.dir, exist_ok=True)
    store = f"sqlite:///{os.path.abspath(args.dir)}/store.db"
    events = generate()
    started = time.time()
    run(build(events), store=store, master=args.master)
    results = {(r.value["topic"], r.value["window"]): r.value["top"] for r in read("trending", store)}
    for (topic, window), top in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        stamp = time.strftime("%H:%M", time.gmtime(window / 1000))
        print(f"{stamp} {topic:<9} " + ", ".join(f"{event} ({score})" for event, score in top))
    matches = results == oracle(events)
    print(f"\n{len(events):,} events, {len(results)} ranked windows in {time.time() - started:.1f} s; "
          f"{'equal to' if matches else 'DIFFERENT from'} the plain-Python oracle")
    return 0 if matches else 1


if __name__ == "__main__":
    sys.exit(main())
