"""Per-hop delivery latency and watermark lag of a three-stage pipeline on local Spark, in
micro-batch mode and in continuous mode, side by side in one run.

    .venv/bin/python bench/pipeline_latency.py [--mode microbatch,continuous] [--rate 2000] [--seconds 30]
        [--store sqlite,postgresql] [--store-url postgresql://…/postgres]

Three stages (keyed by user, by item, by user) at ``--rate`` records/s from a generator injector
that publishes ``--inject-batch`` records per batch (10 by default: at 2,000/s a batch every 5 ms,
so publishing adds milliseconds, not hundreds of them). Each mode runs two variants: exactly-once
with strong productions, and at-least-once with weak productions (the paper's cheaper setting).

**Delivery latency of a hop**, per record: from the commit of the production that holds it to the
moment the consumer's user code sees it. The commit is the journal's ``completed_at`` of the
producer batch the record belongs to, told by the record's id (``names.id_prefix``):
- an injected record ``inject:events:<b>:<n>`` is batch ``b`` of producer ``inject:events`` (its
  publish);
- a production ``C:<shard>:<b>:<n>`` is batch ``b`` of producer ``C`` in micro-batch mode (the
  batch the driver journals once every shard committed), and batch ``b`` of producer ``C/<shard>``
  in continuous mode (the interval's own commit).
Every stage notes ``time.time()`` in ms when its ``process_record`` gets a record, with the
record's id and the generator index ``n`` it descends from, in a file per process (one
``os.write`` per record; the first sighting counts when a batch is retried). **End to end** is
from the injector's publish of record ``n`` to the third stage seeing what descends from it. The
*in stage* time, from a stage seeing a record to the commit of what it produced from it (user
code, the rest of the batch, the commit), is printed too: end to end = three hops + two of those.

**Watermark lag** of a stage: for each injector batch, from its publish (``completed_at``) to the
first journaled batch of the stage whose output watermark reaches that batch's watermark. The
stage's journal ``C`` is written by the driver in micro-batch mode (per batch) and by the
watermark authority in continuous mode (every 100 ms, when it moved); for continuous mode the lag
of the intervals themselves (the moment the last of the ``C/<i>`` journals reached it) is shown
as well, which leaves the authority's polling out.

``--store sqlite,postgresql`` runs every mode and variant on each store in turn, in one run, and
prints PostgreSQL's latencies with their ratio to SQLite's. PostgreSQL is a server started for the
run the way the tests start theirs (``tests/postgres_server.py``: the machine's binaries, default
settings, fsync on), a fresh database per run; ``--store-url`` names a running server's
maintenance database instead (each run still gets a database of its own).

A short warm-up run of each mode goes first, and the first ``--settle`` seconds of each run
(queries or workers starting) are left out. Targets (the issue's; MillWheel §8.1 and §8.2) are
printed beside the measurements with whether each is met.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import importlib.util
import inspect
import os
import platform
import resource
import tempfile
import time
from typing import Any, NamedTuple

from headrace import Computation, Topology, injectors, key_by, run
from headrace.model import END_OF_TIME
from headrace.spark.continuous import ContinuousRunner
from headrace.spark.session import spark_session
from headrace.store import open_store
from percentiles import percentile

STAGES = ["First", "Second", "Third"]
STORES = ("sqlite", "postgresql")
INJECTOR = "inject:events"
MODES = ("microbatch", "continuous")
VARIANTS = [("exactly-once, strong", "strong", {}),
            ("at-least-once, weak", "weak", {"semantics": "at_least_once", "productions": "weak"})]

# The targets. Latency targets apply to continuous mode, per hop; lag targets to each mode.
TARGET_STRONG_P50_MS = 30.0
TARGET_STRONG_P95_MS = 100.0
TARGET_WEAK_P50_MS = 5.0
TARGET_LAG_FIRST_MS = 1_000.0
TARGET_LAG_PER_STAGE_MS = 200.0
TARGET_PG_P50_MS = 5.0  # issue 21: continuous mode on PostgreSQL, exactly-once strong, per hop
TARGET_PG_P99_MS = 50.0


class Observed(Computation):
    """Notes when its user code sees each record (wall ms), then passes the record on."""

    output: str | None = None
    log_dir = ""

    def process_record(self, ctx: Any, record: Any) -> None:
        self.note(record)
        ctx.state = (ctx.state or 0) + 1
        if self.output:
            ctx.produce(self.output, record.value)

    def note(self, record: Any) -> None:
        """One line in this process's log: the record's id, its generator index, when seen."""
        seen = time.time() * 1000
        fd = getattr(self, "_fd", None)
        if fd is None or getattr(self, "_pid", None) != os.getpid():
            fd = os.open(os.path.join(self.log_dir, f"{type(self).__name__}-{os.getpid()}.seen"),
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._fd, self._pid = fd, os.getpid()
        os.write(fd, f"{record.id} {record.value['n']} {seen:.3f}\n".encode())


def stage_class(name: str, output: str | None, log_dir: str) -> type[Computation]:
    # made per run, so the log folder travels with the class (pickled by value to Spark's workers)
    return type(name, (Observed,), {"output": output, "log_dir": log_dir})


def build(rate: float, seconds: float, name: str, log_dir: str, inject_batch: int, **options: Any) -> Topology:
    count = int(rate * seconds)

    def make(i: int) -> dict[str, Any]:
        return {"user": f"u{i % 997}", "item": f"i{i % 613}", "n": i, "ts": int(time.time() * 1000)}

    t = Topology(name)
    t.inject("events", injectors.generator(make, count, timestamp="ts", rate=rate, batch_size=inject_batch,
                                           max_delay_ms=0))
    t.add(stage_class("First", "s1", log_dir), name="First", inputs={"events": key_by("user")}, outputs=["s1"],
          **options)
    t.add(stage_class("Second", "s2", log_dir), name="Second", inputs={"s1": key_by("item")}, outputs=["s2"],
          **options)
    t.add(stage_class("Third", None, log_dir), name="Third", inputs={"s2": key_by("user")}, **options)
    return t


def producer_batch(record_id: str, mode: str) -> tuple[str, int]:
    """The journal entry (producer, batch) of the batch that holds the record (see the docstring)."""
    if record_id.startswith("inject:"):
        producer, batch, _ = record_id.rsplit(":", 2)
        return producer, int(batch)
    name, shard, batch, _ = record_id.rsplit(":", 3)
    return (f"{name}/{shard}" if mode == "continuous" else name), int(batch)


def read_sightings(log_dir: str) -> dict[str, dict[str, tuple[int, float]]]:
    """stage -> record id -> (n, first time seen, ms)."""
    seen: dict[str, dict[str, tuple[int, float]]] = {s: {} for s in STAGES}
    for path in glob.glob(os.path.join(log_dir, "*.seen")):
        stage = os.path.basename(path).split("-", 1)[0]
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 3:
                    continue  # a line cut short by a killed process
                rid, n, at = parts[0], int(parts[1]), float(parts[2])
                old = seen[stage].get(rid)
                if old is None or at < old[1]:
                    seen[stage][rid] = (n, at)
    return seen


class Measured(NamedTuple):
    hops: dict[str, list[float]]      # "inject→First", ... , "end to end"
    in_stage: dict[str, list[float]]  # stage -> seen to the commit of what it produced
    lags: dict[str, list[float]]      # stage -> watermark lag per injector batch
    interval_lags: dict[str, list[float]]  # continuous: the same from the C/<i> journals
    lost: int                          # injected records the third stage never saw


def measure(url: str, log_dir: str, mode: str, settle_s: float, shards: int) -> Measured:
    store = open_store(url)
    try:
        injected = store.batches(INJECTOR)
        sightings = read_sightings(log_dir)
        producers = {producer_batch(rid, mode)[0] for s in STAGES for rid in sightings[s]}
        completed = {(p, b.batch): b.completed_at for p in producers for b in store.batches(p)}
        start = min(b.completed_at for b in injected)
        settled = start + settle_s * 1000
        # per stage: n -> (first time seen, commit of the batch that held what it saw)
        views: dict[str, dict[int, tuple[float, float]]] = {s: {} for s in STAGES}
        hop_of: dict[str, list[tuple[int, float]]] = {s: [] for s in STAGES}  # (n, latency) per sighting
        for stage in STAGES:
            for rid, (n, at) in sightings[stage].items():
                committed = completed.get(producer_batch(rid, mode))
                if committed is None:
                    continue  # a weak production of an attempt whose batch never completed
                hop_of[stage].append((n, at - committed))
                old = views[stage].get(n)
                views[stage][n] = (min(at, old[0]), min(committed, old[1])) if old else (at, committed)
        published = {n: committed for n, (_, committed) in views[STAGES[0]].items()}  # the injector's publish
        measured = {n for n, t in published.items() if t >= settled}
        hops: dict[str, list[float]] = {}
        for k, stage in enumerate(STAGES):
            hops[f"{'inject' if k == 0 else STAGES[k - 1]}→{stage}"] = [v for n, v in hop_of[stage] if n in measured]
        hops["end to end"] = [at - published[n] for n, (at, _) in views[STAGES[-1]].items() if n in measured]
        in_stage = {stage: [views[nxt][n][1] - at for n, (at, _) in views[stage].items()
                            if n in measured and n in views[nxt]]
                    for stage, nxt in zip(STAGES, STAGES[1:])}
        lost = sum(1 for n in published if n not in views[STAGES[-1]])

        marks = [(b.output_watermark, b.completed_at) for b in injected
                 if b.completed_at >= settled and b.output_watermark < END_OF_TIME]
        lags = {s: lag_of(marks, [store.batches(s)]) for s in STAGES}
        interval_lags = ({s: lag_of(marks, [store.batches(f"{s}/{i}") for i in range(shards)]) for s in STAGES}
                         if mode == "continuous" else {})
        return Measured(hops, in_stage, lags, interval_lags, lost)
    finally:
        store.close()


def lag_of(marks: list[tuple[int, int]], journals: list[list[Any]]) -> list[float]:
    """Per injector watermark W published at t: when the last of ``journals`` first journaled an
    output watermark >= W, minus t. Watermarks never reached are left out."""
    lags = []
    series = [([b.output_watermark for b in j], [b.completed_at for b in j]) for j in journals]
    for mark, published in marks:
        reached = []
        for outs, times in series:
            i = bisect.bisect_left(outs, mark)
            if i == len(outs):
                break
            reached.append(times[i])
        else:
            if reached:
                lags.append(max(reached) - published)
    return lags


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def start_postgres(admin_url: str | None) -> Any:
    """The tests' PostgreSQL server (``tests/postgres_server.py``), started for the run unless
    ``admin_url`` names a running one; ``.new_database()`` gives each run a fresh database."""
    spec = importlib.util.spec_from_file_location(
        "postgres_server", os.path.join(os.path.dirname(__file__), "..", "tests", "postgres_server.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PostgresServer(admin_url).start()


def store_url(store: str, folder: str, server: Any) -> str:
    return f"sqlite:///{folder}/store.db" if store == "sqlite" else server.new_database()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="microbatch,continuous", help="comma-separated: microbatch, continuous")
    parser.add_argument("--store", default="sqlite", help="comma-separated: sqlite, postgresql (in that order)")
    parser.add_argument("--store-url", help="PostgreSQL: a running server's maintenance database "
                                            "(postgresql://user@host:port/postgres); else a server is started")
    parser.add_argument("--rate", type=float, default=2_000, help="records injected per second")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--inject-batch", type=int, default=10, help="records per injector batch")
    parser.add_argument("--shards", type=int, default=4, help="key shards (intervals) per stage")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--trigger-ms", type=int, default=50, help="micro-batch mode's trigger")
    parser.add_argument("--settle", type=float, default=8, help="seconds at the start of each run left out (start-up)")
    parser.add_argument("--warm-up", type=float, default=5, help="seconds of the warm-up run of each mode (0: none)")
    parser.add_argument("--compare-progress", type=int, default=0, metavar="PAIRS",
                        help="instead: PAIRS runs of the exactly-once variant without and with the progress queries "
                             "(run(progress_queries=...)), alternating, and their ratios (SQLite only)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}: use {', '.join(MODES)}")
    stores = [s.strip() for s in args.store.split(",") if s.strip()]
    for s in stores:
        if s not in STORES:
            parser.error(f"unknown store {s!r}: use {', '.join(STORES)}")
    stores = [s for s in STORES if s in stores]  # SQLite first: PostgreSQL's ratios are against it
    defaults = {n: p.default for n, p in inspect.signature(ContinuousRunner).parameters.items()}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.rate:,.0f} records/s for {args.seconds:.0f} s through three stages (by user, item, user; "
          f"{args.shards} shards each) on Spark {args.master}, store: {', '.join(stores)}")
    print(f"injector: {args.inject_batch} records per batch ({args.rate / args.inject_batch:,.0f} batches/s); "
          f"micro-batch trigger {args.trigger_ms} ms; continuous: default workers (one per core), "
          f"lease {defaults['lease_ms']:,} ms, authority every "
          f"{defaults['authority_every_ms']} ms; first {args.settle:.0f} s of each run left out")
    server = start_postgres(args.store_url) if "postgresql" in stores else None
    if server is not None:
        print(f"PostgreSQL: {server.admin_url.rsplit('@', 1)[-1]}; " + postgres_settings(server.new_database()))
    spark = spark_session(args.master)
    try:
        if args.compare_progress:
            compare_progress(args, spark, modes)
            return
        results: dict[tuple[str, str, str], Measured] = {}
        for store in stores:
            for mode in modes:
                trigger = {"trigger_ms": args.trigger_ms} if mode == "microbatch" else {}  # continuous has none
                if args.warm_up > 0:  # the JVM's and the workers' start-up, outside the measured runs
                    warm = tempfile.mkdtemp(prefix="headrace-latency-warm-")
                    run(build(args.rate, args.warm_up, f"latency_warm_{mode}", warm, args.inject_batch,
                              shards=args.shards),
                        store=store_url(store, warm, server), spark=spark, progress=None, mode=mode, **trigger)
                for label, tag, options in VARIANTS:
                    folder = tempfile.mkdtemp(prefix=f"headrace-latency-{store}-{mode}-{tag}-")
                    url = store_url(store, folder, server)
                    started = time.perf_counter()
                    run(build(args.rate, args.seconds, f"latency_{mode}_{tag}", folder, args.inject_batch,
                              shards=args.shards, **options),
                        store=url, spark=spark, progress=None, mode=mode, **trigger)
                    took = time.perf_counter() - started
                    results[(store, mode, tag)] = m = measure(url, folder, mode, args.settle, args.shards)
                    print(f"  ran {store} {mode} {label} in {took:.1f} s ({folder})", flush=True)
                    if m.lost:
                        print(f"  WARNING: {store} {mode} {label}: {m.lost:,} injected records never reached "
                              "the third stage")
        print_results(args, stores, modes, results)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        others = peak_rss_of_descendants(os.getpid())
        print(f"peak memory (VmHWM): Python driver {peak_mb:,.0f} MB; " +
              ", ".join(f"{name} {mb:,.0f} MB" for name, mb in others))
    finally:
        spark.stop()
        if server is not None:
            server.stop()


def postgres_settings(url: str) -> str:
    """The server settings that bear on a commit's latency, as the bench ran with them."""
    import psycopg

    names = ["fsync", "synchronous_commit", "wal_sync_method", "commit_delay", "shared_buffers"]
    with psycopg.connect(url, autocommit=True) as db:
        got = db.execute("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)", [names]).fetchall()
    return ", ".join(f"{n} = {v}" for n, v in sorted(got, key=lambda r: names.index(r[0])))


def print_results(args: Any, stores: list[str], modes: list[str],
                  results: dict[tuple[str, str, str], Measured]) -> None:
    base = stores[0] if len(stores) > 1 else None
    print()
    print("delivery latency (ms): hop = from the commit of the batch holding the record to the consumer's user code"
          + (f"; x: p50 and p99 against {base}'s, same run" if base else ""))
    print(f"{'store':<11} {'mode':<11} {'variant':<21} {'hop':<15} {'records':>8} {'p50':>8} {'p95':>8} {'p99':>8}"
          + (f" {'p50 x':>7} {'p99 x':>7}" if base else ""))
    for store in stores:
        for mode in modes:
            for label, tag, _ in VARIANTS:
                m = results[(store, mode, tag)]
                for hop, values in m.hops.items():
                    line = (f"{store:<11} {mode:<11} {label:<21} {hop:<15} {len(values):>8,} {percentile(values, .5):>8,.1f} "
                            f"{percentile(values, .95):>8,.1f} {percentile(values, .99):>8,.1f}")
                    if base and store != base:
                        ref = results[(base, mode, tag)].hops[hop]
                        line += "".join(f" {percentile(values, q) / percentile(ref, q):>6.2f}x" for q in (.5, .99))
                    print(line)
                inside = ", ".join(f"{s} {percentile(v, .5):,.1f} / {percentile(v, .95):,.1f}" for s, v in m.in_stage.items())
                print(f"{'':<45} in stage, seen to the commit of its output, p50 / p95: {inside}")
    print()
    print("watermark lag (ms), p50 / p95: from an injector batch's publish to the stage's journaled output "
          "watermark reaching it")
    print(f"{'store':<11} {'mode':<11} {'variant':<21} {'journal':<22} " + " ".join(f"{s:>17}" for s in STAGES))
    for store in stores:
        for mode in modes:
            for label, tag, _ in VARIANTS:
                m = results[(store, mode, tag)]
                rows = [("C (driver)" if mode == "microbatch" else "C (authority)", m.lags)]
                if m.interval_lags:
                    rows.append(("C/<i> (intervals)", m.interval_lags))
                for journal, lags in rows:
                    print(f"{store:<11} {mode:<11} {label:<21} {journal:<22} " +
                          " ".join(f"{f'{percentile(lags[s], .5):,.0f} / {percentile(lags[s], .95):,.0f}':>17}" for s in STAGES))
    print()
    print("targets:")
    for store in stores:
        for mode in modes:
            print_targets(store, mode, results)


def print_targets(store: str, mode: str, results: dict[tuple[str, str, str], Measured]) -> None:
    strong, weak = results[(store, mode, "strong")], results[(store, mode, "weak")]
    per_hop = [h for h in strong.hops if h != "end to end"]
    worst50 = max(percentile(strong.hops[h], .5) for h in per_hop)
    worst95 = max(percentile(strong.hops[h], .95) for h in per_hop)
    worst99 = max(percentile(strong.hops[h], .99) for h in per_hop)
    weak50 = max(percentile(weak.hops[h], .5) for h in per_hop)
    scope = "" if mode == "continuous" else "  (the targets are continuous mode's; shown for comparison)"
    print(f"  {store} {mode}{scope}")
    print(f"    exactly-once strong, per hop p50 <= {TARGET_STRONG_P50_MS:g} ms: worst hop {worst50:,.1f} ms: "
          f"{verdict(worst50 <= TARGET_STRONG_P50_MS)}")
    print(f"    exactly-once strong, per hop p95 <= {TARGET_STRONG_P95_MS:g} ms: worst hop {worst95:,.1f} ms: "
          f"{verdict(worst95 <= TARGET_STRONG_P95_MS)}")
    if store == "postgresql":  # issue 21's, for the store a cluster uses
        print(f"    exactly-once strong, per hop p50 <= {TARGET_PG_P50_MS:g} ms and p99 <= {TARGET_PG_P99_MS:g} ms "
              f"(issue 21): worst hop p50 {worst50:,.1f} ms, p99 {worst99:,.1f} ms: "
              f"{verdict(worst50 <= TARGET_PG_P50_MS and worst99 <= TARGET_PG_P99_MS)}")
    print(f"    at-least-once weak, per hop p50 <= {TARGET_WEAK_P50_MS:g} ms: worst hop {weak50:,.1f} ms: "
          f"{verdict(weak50 <= TARGET_WEAK_P50_MS)}")
    for label, tag, _ in VARIANTS:
        lags = results[(store, mode, tag)].lags
        first = percentile(lags[STAGES[0]], .5)
        steps = [percentile(lags[b], .5) - percentile(lags[a], .5) for a, b in zip(STAGES, STAGES[1:])]
        print(f"    {label}: watermark lag p50 at {STAGES[0]} <= {TARGET_LAG_FIRST_MS:,.0f} ms: {first:,.0f} ms: "
              f"{verdict(first <= TARGET_LAG_FIRST_MS)}; each further stage adds <= "
              f"{TARGET_LAG_PER_STAGE_MS:,.0f} ms: " + ", ".join(f"+{s:,.0f}" for s in steps) +
              f" ms: {verdict(all(s <= TARGET_LAG_PER_STAGE_MS for s in steps))}")


def compare_progress(args: Any, spark: Any, modes: list[str]) -> None:
    """The cost of the progress queries: the exactly-once variant without them (the baseline) and
    with them, alternating in one session, and the ratios with / without."""
    for mode in modes:
        trigger = {"trigger_ms": args.trigger_ms} if mode == "microbatch" else {}
        if args.warm_up > 0:
            warm = tempfile.mkdtemp(prefix="headrace-latency-warm-")
            run(build(args.rate, args.warm_up, f"latency_warm_{mode}", warm, args.inject_batch, shards=args.shards),
                store=f"sqlite:///{warm}/store.db", spark=spark, progress=None, mode=mode, **trigger)
        runs: dict[bool, list[Measured]] = {False: [], True: []}
        for n in range(args.compare_progress):
            for on in (False, True):
                folder = tempfile.mkdtemp(prefix=f"headrace-latency-{mode}-progress-{'on' if on else 'off'}-")
                run(build(args.rate, args.seconds, f"latency_{mode}_{n}_{on}", folder, args.inject_batch,
                          shards=args.shards),
                    store=f"sqlite:///{folder}/store.db", spark=spark, progress=None, mode=mode,
                    progress_queries=on, **trigger)
                runs[on].append(measure(f"sqlite:///{folder}/store.db", folder, mode, args.settle, args.shards))
                print(f"  ran {mode} exactly-once, progress queries {'on' if on else 'off'} ({folder})", flush=True)
        print(f"\n{mode}, exactly-once strong, {args.compare_progress} run(s) each, all records pooled (ms):")
        print(f"{'':<28} {'off (baseline)':>15} {'on':>10} {'on / off':>9}")
        pooled = {on: Measured({h: [v for m in ms for v in m.hops[h]] for h in ms[0].hops}, {},
                               {s: [v for m in ms for v in m.lags[s]] for s in STAGES}, {}, 0)
                  for on, ms in runs.items()}
        worst = {on: (max(percentile(m.hops[h], .5) for h in m.hops if h != "end to end"),
                      max(percentile(m.hops[h], .95) for h in m.hops if h != "end to end")) for on, m in pooled.items()}
        rows = [("worst hop p50", worst[False][0], worst[True][0]), ("worst hop p95", worst[False][1], worst[True][1])]
        rows += [(f"end to end p{int(q * 100)}", percentile(pooled[False].hops["end to end"], q),
                  percentile(pooled[True].hops["end to end"], q)) for q in (.5, .95, .99)]
        rows += [(f"watermark lag p50 {s}", percentile(pooled[False].lags[s], .5), percentile(pooled[True].lags[s], .5))
                 for s in STAGES]
        for label, off, on_ in rows:
            print(f"{label:<28} {off:>15,.1f} {on_:>10,.1f} {on_ / off if off else float('nan'):>8.2f}x")


def peak_rss_of_descendants(root: int, field: str = "VmHWM", skip: int | None = None) -> list[tuple[str, float]]:
    """Peak resident memory (``field="VmRSS"``: current) of every live descendant (the JVM, Python
    workers) in MB, from /proc; ``skip`` is a process left out (a measuring one)."""
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        children = []
        for task in glob.glob(f"/proc/{pid}/task/*/children"):  # every thread's: the JVM forks from others
            try:
                children += open(task).read().split()
            except OSError:
                continue
        for child in map(int, children):
            if child == skip:
                continue
            stack.append(child)
            try:
                status = dict(line.split(":", 1) for line in open(f"/proc/{child}/status").read().splitlines()
                              if ":" in line)
                name = "JVM" if "java" in status["Name"] else status["Name"].strip()
                if name != "JVM" and not name.startswith("python"):  # python3.12 and the like too
                    continue
                out.append((name, int(status[field].split()[0]) / 1024))
            except (OSError, KeyError, ValueError):
                continue
    return out


if __name__ == "__main__":
    main()
