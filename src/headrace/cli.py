"""``headrace run module:topology``, ``headrace watermarks``, ``headrace read STREAM``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from typing import Sequence

from .errors import HeadraceError, OptionError
from .model import BEGINNING_OF_TIME, END_OF_TIME
from .store import DEFAULT_STORE_URL
from .topology import Topology

__all__ = ["main"]


def load_topology(target: str) -> Topology:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise OptionError("Name the topology as module:attribute", got=target,
                          hint="e.g. headrace run examples.zeitgeist.job:topology")
    sys.path.insert(0, ".")
    module = importlib.import_module(module_name)
    topology = getattr(module, attr, None)
    if callable(topology) and not isinstance(topology, Topology):
        topology = topology()
    if not isinstance(topology, Topology):
        raise OptionError(f"{target} is not a headrace Topology", got=topology,
                          hint="point at a Topology object, or a function returning one")
    return topology


def show_mark(ms: int) -> str:
    if ms >= END_OF_TIME:
        return "end-of-time"
    if ms <= BEGINNING_OF_TIME:
        return "beginning"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="headrace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run a topology on Spark until drained (or Ctrl-C)")
    p_run.add_argument("topology", help="module:attribute naming a Topology (or a function returning one)")
    p_run.add_argument("--store", default=DEFAULT_STORE_URL)
    p_run.add_argument("--master", default="local[*]")
    p_run.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    p_run.add_argument("--mode", default="continuous", choices=["continuous", "microbatch"],
                       help="microbatch: a Spark query per computation; continuous: long-lived workers that own key intervals")
    p_run.add_argument("--no-ui", action="store_true", help="turn Spark's web UI off (it is on, and its URL printed)")
    p_wm = sub.add_parser("watermarks", help="show the journaled low watermark of every stage")
    p_wm.add_argument("--store", default=DEFAULT_STORE_URL)
    p_wm.add_argument("--json", action="store_true")
    p_read = sub.add_parser("read", help="print the committed records of a stream as JSON lines")
    p_read.add_argument("stream")
    p_read.add_argument("--store", default=DEFAULT_STORE_URL)
    p_read.add_argument("--limit", type=int, default=None, help="print at most this many records")
    args = parser.parse_args(argv)

    from .api import read, run, watermarks

    try:
        if args.command == "run":
            result = run(load_topology(args.topology), store=args.store, master=args.master, timeout_s=args.timeout,
                         mode=args.mode, ui=not args.no_ui)
            print(f"drained in {result.elapsed_s:.1f} s: " + ", ".join(
                f"{n}: {s.batches} batches, {s.counters.get('records', 0)} records" for n, s in result.stats.items()))
        elif args.command == "watermarks":
            marks = watermarks(args.store)
            if args.json:
                print(json.dumps({p: i._asdict() for p, i in marks.items()}))
            for producer, info in marks.items():
                if not args.json:
                    print(f"{producer:<32} batch {info.batch:>6}  input {show_mark(info.input_watermark):<26} "
                          f"output {show_mark(info.output_watermark)}")
        elif args.command == "read":
            for record in read(args.stream, args.store, limit=args.limit):
                print(json.dumps(record._asdict(), default=repr))
    except HeadraceError as exc:
        print(f"headrace: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headrace: stopped; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
