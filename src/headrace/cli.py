"""``headrace run module:topology``, ``headrace watermarks``, ``headrace read STREAM``, ``headrace status``,
``headrace state C KEY``, ``headrace timers C KEY``, ``headrace dead-letters C``, ``headrace dashboard``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from typing import Sequence

from .errors import HeadraceError, OptionError
from .monitor.show import show_mark, status_text
from .store import DEFAULT_STORE_URL
from .store.redact import redact_url
from .topology import Topology

__all__ = ["main"]

UNPICKLE = ("decode pickled values in full: this runs whatever code the bytes name, so only for a store "
            "nobody untrusted can write (default: plain data only, anything else shown by its size)")


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
    p_run.add_argument("--metrics-port", type=int, default=None,
                       help="serve Prometheus metrics on http://<this host>:PORT/metrics while it runs (0: any free port)")
    p_run.add_argument("--dashboard-port", type=int, default=0, help="serve the dashboard there (0: a free port)")
    p_run.add_argument("--no-dashboard", action="store_true", help="serve no dashboard")
    p_run.add_argument("--progress-queries", action="store_true",
                       help="put each computation's numbers in Spark's streaming progress events (a light query each)")
    p_run.add_argument("--py-files", action="append", default=[], metavar="PATH",
                       help="also ship this Python file, zip or package folder to the executors (repeatable); "
                            "the topology's own package is always shipped")
    p_dash = sub.add_parser("dashboard", help="serve the web dashboard of a store (topology, watermarks, lag, keys)")
    p_dash.add_argument("--store", default=DEFAULT_STORE_URL)
    p_dash.add_argument("--port", type=int, default=8050, help="0: any free port")
    p_dash.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves every interface")
    p_dash.add_argument("--unpickle", action="store_true", help=UNPICKLE)
    p_run.add_argument("--no-ui", action="store_true", help="turn Spark's web UI off (it is on, and its URL printed)")
    p_run.add_argument("--no-rebalance", action="store_true",
                       help="continuous mode: keep every interval where it is claimed (no live rebalancing)")
    p_run.add_argument("--workers", type=int, default=None,
                       help="continuous mode: how many workers (Spark tasks owning key intervals); "
                            "default one per free task slot")
    p_wm = sub.add_parser("watermarks", help="show the journaled low watermark of every stage")
    p_wm.add_argument("--store", default=DEFAULT_STORE_URL)
    p_wm.add_argument("--json", action="store_true")
    p_read = sub.add_parser("read", help="print the committed records of a stream as JSON lines")
    p_read.add_argument("stream")
    p_read.add_argument("--store", default=DEFAULT_STORE_URL)
    p_read.add_argument("--limit", type=int, default=None, help="print at most this many records")
    p_read.add_argument("--unpickle", action="store_true", help=UNPICKLE)
    p_status = sub.add_parser("status", help="every stage's watermarks, lag, throughput, backlog, owners, alerts")
    p_status.add_argument("--store", default=DEFAULT_STORE_URL)
    p_status.add_argument("--json", action="store_true", help="the same as JSON (one object per refresh)")
    p_status.add_argument("--watch", action="store_true", help="refresh every --every seconds until Ctrl-C")
    p_status.add_argument("--every", type=float, default=2.0, help=argparse.SUPPRESS)
    for command, text in (("state", "a key's state, decoded with the computation's codec"),
                          ("timers", "a key's pending timers")):
        p_key = sub.add_parser(command, help=text)
        p_key.add_argument("computation")
        p_key.add_argument("key")
        p_key.add_argument("--store", default=DEFAULT_STORE_URL)
        if command == "state":
            p_key.add_argument("--unpickle", action="store_true", help=UNPICKLE)
    p_dead = sub.add_parser("dead-letters", help="what a computation sent to <computation>.dead_letter, as JSON lines")
    p_dead.add_argument("computation")
    p_dead.add_argument("--store", default=DEFAULT_STORE_URL)
    p_dead.add_argument("--unpickle", action="store_true", help=UNPICKLE)
    args = parser.parse_args(argv)

    from .api import read, run, watermarks
    from .monitor import dead_letters, state, status, timers

    try:
        if args.command == "run":
            from .spark.shipping import user_package

            topology = load_topology(args.topology)
            package = user_package(args.topology.partition(":")[0])
            result = run(topology, store=args.store, master=args.master, timeout_s=args.timeout,
                         mode=args.mode, metrics_port=args.metrics_port,
                         dashboard_port=None if args.no_dashboard else args.dashboard_port, progress=sys.stderr,
                         ui=not args.no_ui, py_files=[*([package] if package else []), *args.py_files],
                         progress_queries=args.progress_queries, rebalance=not args.no_rebalance,
                         workers=args.workers)
            print(f"drained in {result.elapsed_s:.1f} s: " + ", ".join(
                f"{n}: {s.batches} batches, {s.counters.get('records', 0)} records" for n, s in result.stats.items()))
        elif args.command == "dashboard":
            from .dashboard import Dashboard

            board = Dashboard(args.store, host=args.host, port=args.port, unpickle=args.unpickle)
            print(f"headrace: dashboard of {redact_url(args.store)} at {board.url} (Ctrl-C stops it)", flush=True)
            try:
                board.serve_forever()
            except KeyboardInterrupt:
                return 0
        elif args.command == "watermarks":
            marks = watermarks(args.store)
            if args.json:
                print(json.dumps({p: i._asdict() for p, i in marks.items()}))
            for producer, info in marks.items():
                if not args.json:
                    print(f"{producer:<32} batch {info.batch:>6}  input {show_mark(info.input_watermark):<26} "
                          f"output {show_mark(info.output_watermark)}")
        elif args.command == "read":
            for record in read(args.stream, args.store, limit=args.limit, unpickle=args.unpickle):
                print(json.dumps(record._asdict(), default=repr))
        elif args.command == "status":
            while True:
                report = status(args.store)
                if args.json:
                    print(json.dumps(report), flush=True)
                else:
                    print(("\033[H\033[J" if args.watch else "") + status_text(report), flush=True)
                if not args.watch:
                    break
                time.sleep(args.every)
        elif args.command == "state":
            print(json.dumps(state(args.store, args.computation, args.key, unpickle=args.unpickle), default=repr))
        elif args.command == "timers":
            for timer in timers(args.store, args.computation, args.key):
                print(json.dumps(timer._asdict()))
        elif args.command == "dead-letters":
            for record in dead_letters(args.store, args.computation, unpickle=args.unpickle):
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
