"""Soak: the three-stage pipeline of ``bench/pipeline_latency.py`` in continuous mode at a steady
rate for many minutes with a replay window, reporting each minute whether anything grows.

    .venv/bin/python bench/soak.py [--store sqlite|postgresql] [--store-url URL] [--minutes 20 | --long]
                                   [--rate 2000] [--inject-batch 10] [--window-s 10] [--retention-s 60] [--out DIR]

Stages: First (by user) -> Second (by item) -> Third (by user), the last counting records per user
and event-time window of ``--window-s`` in state and emitting each count from a watermark timer at
the window's end into stream ``counts``. A ``foreach_batch`` sink appends ``counts`` to a file as it
is committed (so the stream has a reader and the replay window trims it too); at the end those
counts must equal the oracle: the generator's input is deterministic (record ``n`` has user
``u{n % 997}`` and event time ``t0 + n * 1000 // rate``), so the counts per (user, window) are known.
The run passes ``run(retention_ms=--retention-s * 1000)``: the driver trims the bus every 10 s.

Every 2 s a sampler, in a process of its own (not the driver's, whose interpreter runs the injector),
reads the stages' sighting logs and the journal rows written since its last sample (per-hop delivery latency, as
``pipeline_latency.py`` measures it: from the ``completed_at`` of the batch that holds a record to
the consumer's user code) and the watermark lag of Third (an injector batch's publish to the
authority's ``Third`` journal reaching its watermark; marks not reached 10 s after publish are
counted as "late", not in the percentiles). Every minute one row: store size on disk (SQLite: file
+ WAL + SHM; PostgreSQL: ``pg_database_size``), per-hop p50/p99 of that minute, Third's watermark
lag p50/max, RSS of the Python driver, of Spark's JVM and the sum over pyspark Python workers.

Checks at the end (the issue's, scaled): the reference minute is ``R = min(5, max(1, minutes // 4))``
(5 for a 20-minute run; 1 for ``--minutes 3``) and the "last" minutes are the last ``min(5,
minutes - R)``: the store's size there stays within 10 % of minute R's; each hop's p99 and each
process's memory there within 1.5x of minute R's; and the outputs equal the oracle. Row counts per
table at minute R and at the end show what grew. The table is written as CSV and an SVG plot under
``--out`` (default ``bench/results``). The run drains: the injector is bounded to rate x minutes.
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import threading
import time
from typing import Any, Callable

from pyspark import cloudpickle
import pipeline_latency
from pipeline_latency import Observed, stage_class, start_postgres
from soak_sampler import HOPS, SamplerProcess, Store

from headrace import Topology, injectors, key_by, run
from headrace.spark.session import spark_session

USERS, ITEMS = 997, 613
SIZE_LIMIT, GROWTH_LIMIT = 1.10, 1.5
cloudpickle.register_pickle_by_value(pipeline_latency)  # Spark's workers do not have bench/ on their path


class WindowCount(Observed):
    """Third: notes each record, counts per event-time window, emits at the window's end."""

    window_ms = 10_000

    def process_record(self, ctx: Any, record: Any) -> None:
        self.note(record)
        counts = ctx.state or {}
        end = record.timestamp - record.timestamp % self.window_ms + self.window_ms
        if end not in counts:
            counts[end] = 0
            ctx.set_timer(str(end), end)
        counts[end] += 1
        ctx.state = counts

    def process_timer(self, ctx: Any, timer: Any) -> None:
        counts = ctx.state
        ctx.produce("counts", {"user": ctx.key, "end": timer.timestamp, "total": counts.pop(timer.timestamp)})
        ctx.state = counts or None


def event_time(t0: int, n: int, rate: float) -> int:
    return t0 + int(n * 1000 // rate)


def build(count: int, rate: float, t0: int, log_dir: str, inject_batch: int, window_ms: int, shards: int,
          sink: Callable[[Any, int], None]) -> Topology:
    def make(i: int) -> dict[str, Any]:
        return {"user": f"u{i % USERS}", "item": f"i{i % ITEMS}", "n": i, "ts": event_time(t0, i, rate)}

    t = Topology("soak")
    t.inject("events", injectors.generator(make, count, timestamp="ts", rate=rate, batch_size=inject_batch,
                                           max_delay_ms=0))
    t.add(stage_class("First", "s1", log_dir), name="First", inputs={"events": key_by("user")}, outputs=["s1"],
          shards=shards)
    t.add(stage_class("Second", "s2", log_dir), name="Second", inputs={"s1": key_by("item")}, outputs=["s2"],
          shards=shards)
    third = type("Third", (WindowCount,), {"log_dir": log_dir, "window_ms": window_ms})
    t.add(third, name="Third", inputs={"s2": key_by("user")}, outputs=["counts"], shards=shards)
    t.stream("counts", schema="user STRING, `end` BIGINT, total BIGINT")
    t.sink("counts", foreach_batch=sink)
    return t


def oracle(count: int, rate: float, t0: int, window_ms: int) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for n in range(count):
        ts = event_time(t0, n, rate)
        key = (f"u{n % USERS}", ts - ts % window_ms + window_ms)
        out[key] = out.get(key, 0) + 1
    return out


class OutputFile:
    """The sink's ``fn``: appends each committed count as a line (the bench keeps none in memory)."""

    def __init__(self, path: str) -> None:
        self.path, self._lock = path, threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        lines = "".join(f"{r.id} {r.value['user']} {r.value['end']} {r.value['total']}\n" for r in df.collect())
        with self._lock, open(self.path, "a") as f:
            f.write(lines)

    def compare(self, expected: dict[tuple[str, int], int]) -> tuple[bool, str]:
        by_id: dict[str, tuple[str, int, int]] = {}
        with open(self.path) as f:
            for line in f:
                rid, user, end_, total_ = line.split()
                by_id[rid] = (user, int(end_), int(total_))  # a replayed sink batch carries the same ids
        got: dict[tuple[str, int], int] = {}
        repeated = 0
        for user, end, total in by_id.values():
            repeated += (user, end) in got
            got[(user, end)] = got.get((user, end), 0) + total
        missing = sum(1 for k in expected if k not in got)
        wrong = sum(1 for k, v in got.items() if expected.get(k) != v)
        detail = (f"{len(got):,} (user, window) counts of {sum(got.values()):,} records vs oracle {len(expected):,} "
                  f"of {sum(expected.values()):,}; missing {missing:,}, wrong {wrong:,}, emitted twice {repeated:,}")
        return got == expected and repeated == 0, detail


def print_row(row: dict[str, Any]) -> None:
    hops = "  ".join(f"{row[f'{h} p50']:6.1f}/{row[f'{h} p99']:7.1f}" for h in HOPS)
    print(f"{row['minute']:>5}{'*' if row['partial'] else ' '} {row['store_mb']:>9.1f} {row['wal_mb']:>7.1f}  {hops}  {row['lag p50']:7.0f}/{row['lag max']:7.0f} "
          f"{row['lag late']:>5} {row['driver_mb']:>8.0f} {row['jvm_mb']:>8.0f} {row['workers_mb']:>9.0f}", flush=True)


def checks(rows: list[dict[str, Any]], reference: int, outputs: tuple[bool, str]) -> bool:
    rows = [r for r in rows if not r["partial"]]  # the drain's last seconds are no minute
    ref = next((r for r in rows if r["minute"] == reference), None)
    last = [r for r in rows if r["minute"] > reference][-min(5, max(1, len(rows) - reference)):]
    results = []
    if ref is None or not last:
        results.append((False, f"need minute {reference} and at least one later minute: got {len(rows)} rows"))
    else:
        def within(column: str, limit: float, what: str) -> None:
            worst = max(r[column] for r in last)
            ok = worst <= limit * ref[column]
            ratio = f"{worst / ref[column]:.2f}x" if ref[column] else "n/a"
            results.append((ok, f"{what}: minute {reference} {ref[column]:,.1f}, last {len(last)} minutes at most "
                                f"{worst:,.1f} ({ratio}, limit {limit:.2f}x)"))
        within("store_mb", SIZE_LIMIT, "store size MB")
        for hop in HOPS:
            within(f"{hop} p99", GROWTH_LIMIT, f"{hop} p99 ms")
        for column, what in (("driver_mb", "Python driver RSS MB"), ("jvm_mb", "JVM RSS MB"),
                             ("workers_mb", "Python workers RSS MB")):
            within(column, GROWTH_LIMIT, what)
    results.append((outputs[0], f"outputs equal the oracle: {outputs[1]}"))
    print("\nchecks:")
    for ok, text in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    return all(ok for ok, _ in results)


def write_svg(rows: list[dict[str, Any]], path: str) -> None:
    """Four small panels by hand (no plotting library in the lock file): size, p99 per hop, lag, memory."""
    panels = [("store size (MB)", ["store_mb"]), ("per-hop p99 (ms)", [f"{h} p99" for h in HOPS]),
              ("Third watermark lag p50 (ms)", ["lag p50"]), ("RSS (MB)", ["driver_mb", "jvm_mb", "workers_mb"])]
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    w, h, pad = 420, 220, 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{2 * h}" font-size="11" '
             f'font-family="sans-serif">']
    xs = [r["minute"] for r in rows] or [1]
    for k, (title, columns) in enumerate(panels):
        ox, oy = (k % 2) * w, (k // 2) * h
        values = [r[c] for r in rows for c in columns if r[c] == r[c]]
        top = max(values, default=1) * 1.1 or 1
        parts.append(f'<text x="{ox + pad}" y="{oy + 15}">{title} (0 to {top:,.0f}) by minute</text>')
        parts.append(f'<rect x="{ox + pad}" y="{oy + 20}" width="{w - 2 * pad}" height="{h - pad - 20}" '
                     f'fill="none" stroke="#999"/>')
        for j, column in enumerate(columns):
            points = " ".join(
                f"{ox + pad + (r['minute'] - min(xs)) / max(1, max(xs) - min(xs)) * (w - 2 * pad):.1f},"
                f"{oy + h - pad - r[column] / top * (h - pad - 20):.1f}" for r in rows if r[column] == r[column])
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colours[j]}" stroke-width="2"/>')
            parts.append(f'<text x="{ox + pad + 5}" y="{oy + h - 8 - 12 * (len(columns) - 1 - j)}" '
                         f'fill="{colours[j]}">{column.replace("→", "-&gt;")}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--store-url", help="an empty PostgreSQL database (else a server is started for the run)")
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--long", action="store_true", help="60 minutes")
    parser.add_argument("--rate", type=float, default=2_000, help="records injected per second")
    parser.add_argument("--inject-batch", type=int, default=10, help="records per injector batch")
    parser.add_argument("--window-s", type=int, default=10, help="Third's event-time window")
    parser.add_argument("--retention-s", type=int, default=60, help="the run's replay window (retention_ms)")
    parser.add_argument("--shards", type=int, default=4, help="key intervals per stage")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    minutes = 60 if args.long else args.minutes
    if minutes < 2:
        parser.error("--minutes must be at least 2 (a reference minute and a later one)")
    folder = tempfile.mkdtemp(prefix="headrace-soak-")
    server = None
    if args.store == "sqlite":
        url = f"sqlite:///{folder}/store.db"
    elif args.store_url:
        url = args.store_url
    else:
        server = start_postgres(None)
        url = server.new_database()
    count, t0 = int(args.rate * minutes * 60), int(time.time() * 1000)
    outputs = OutputFile(os.path.join(folder, "counts.txt"))
    reference = min(5, max(1, minutes // 4))
    print(f"soak: {args.rate:,.0f} records/s in batches of {args.inject_batch} for {minutes} min, continuous mode, "
          f"{args.store} store ({url}), replay window {args.retention_s} s, Third's windows {args.window_s} s, "
          f"{args.shards} shards a stage, Spark {args.master}; reference minute {reference}; logs in {folder}")
    print(f"{'minute':>6} {'store MB':>9} {'WAL MB':>7}  " + "  ".join(f"{h + ' p50/p99':>14}" for h in HOPS) +
          f"  {'lag p50/max':>15} {'late':>5} {'driver MB':>8} {'JVM MB':>8} {'workers MB':>9}")
    rows: list[dict[str, Any]] = []

    def on_row(row: dict[str, Any]) -> None:
        rows.append(row)
        print_row(row)

    try:
        spark = spark_session(args.master)
        sampler = SamplerProcess(url, folder, minutes, on_row)
        topology = build(count, args.rate, t0, folder, args.inject_batch, args.window_s * 1000, args.shards, outputs)
        sampler.start()
        started = time.time()
        run(topology, store=url, spark=spark, progress=None, mode="continuous", retention_ms=args.retention_s * 1000)
        took = time.time() - started
        totals = sampler.finish()
        print(f"ran {count:,} records in {took:.0f} s; sightings whose batch was trimmed before measured: "
              f"{totals['unresolved']:,}")
        final = Store(url).rows()
        final.update({f"batches of {k}": v for k, v in Store(url).journal().items()})
        print(f"\nrows per table: minute {reference} -> end")
        for table in sorted(set(final) | set(totals['reference_rows'])):
            print(f"  {table:<30} {totals['reference_rows'].get(table, 0):>10,} -> {final.get(table, 0):>10,}")
        final_mb = Store(url).table_mb()
        print(f"\nMB per table with its indexes: minute {reference} -> end")
        for table in sorted(set(final_mb) | set(totals['reference_mb'])):
            print(f"  {table:<30} {totals['reference_mb'].get(table, 0):>10.1f} -> {final_mb.get(table, 0):>10.1f}")
        ok = checks(rows, reference, outputs.compare(oracle(count, args.rate, t0, args.window_s * 1000)))
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"soak-{args.store}-{minutes}min")
        with open(stem + ".csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["minute"])
            writer.writeheader()
            writer.writerows(rows)
        write_svg(rows, stem + ".svg")
        print(f"wrote {stem}.csv and {stem}.svg")
        spark.stop()
        raise SystemExit(0 if ok else 1)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
