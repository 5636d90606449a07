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

Every 10 s a sampler, in a process of its own (not the driver's, whose interpreter runs the injector),
reads the stages' sighting logs and the journal (per-hop delivery latency, as
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
import glob
import multiprocessing
import os
import queue
import sqlite3
import tempfile
import threading
import time
from typing import Any, Callable

from pyspark import cloudpickle
import pipeline_latency
from pipeline_latency import INJECTOR, STAGES, Observed, lag_of, pct, peak_rss_of_descendants, producer_batch, \
    stage_class, start_postgres

from headrace import Topology, injectors, key_by, run
from headrace.model import END_OF_TIME
from headrace.spark.session import spark_session
from headrace.store import open_store

HOPS = [f"{'inject' if k == 0 else STAGES[k - 1]}→{s}" for k, s in enumerate(STAGES)]
USERS, ITEMS = 997, 613
SAMPLE_S = 10.0
LAG_GRACE_MS = 10_000
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


class Store:
    """Size on disk and row counts per table, beside the run's own connections."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = url[len("sqlite:///"):] if url.startswith("sqlite") else None

    def size_mb(self) -> float:
        if self.path:
            return sum(os.path.getsize(p) for p in (self.path, self.path + "-wal", self.path + "-shm")
                       if os.path.exists(p)) / 2**20
        return float(self._pg("SELECT pg_database_size(current_database())")[0][0]) / 2**20

    def wal_mb(self) -> float:
        """SQLite's write-ahead log alone (0 on PostgreSQL, whose WAL is the server's)."""
        wal = f"{self.path}-wal" if self.path else ""
        return os.path.getsize(wal) / 2**20 if wal and os.path.exists(wal) else 0.0

    def table_mb(self) -> dict[str, float]:
        """MB used per table with its indexes (SQLite: pages in use, from ``dbstat``, free pages
        apart; PostgreSQL: ``pg_total_relation_size``, which counts dead rows not yet vacuumed)."""
        if self.path:
            with sqlite3.connect(self.path) as db:
                found = list(db.execute(
                    "SELECT COALESCE(m.tbl_name, d.name), SUM(d.pgsize - d.unused) FROM dbstat d "
                    "LEFT JOIN sqlite_master m ON m.name = d.name GROUP BY 1"))
                page, free = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "freelist_count"))
                found.append(("(free pages)", page * free))
        else:
            found = self._pg("SELECT relname, pg_total_relation_size(c.oid) FROM pg_class c "
                             "JOIN pg_namespace n ON n.oid = c.relnamespace "
                             "WHERE c.relkind = 'r' AND n.nspname = current_schema()")
        return {str(name): int(size) / 2**20 for name, size in found}

    def rows(self) -> dict[str, int]:
        if self.path:
            with sqlite3.connect(self.path) as db:
                tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
                return {t: db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in sorted(tables)}
        tables = [r[0] for r in self._pg("SELECT table_name FROM information_schema.tables "
                                         "WHERE table_schema = current_schema() ORDER BY 1")]
        return {t: int(self._pg(f'SELECT COUNT(*) FROM "{t}"')[0][0]) for t in tables}

    def journal(self) -> dict[str, int]:
        """Journal rows per producer kind (injector, a computation's authority, its intervals)."""
        sql = "SELECT producer, COUNT(*) FROM batches GROUP BY producer"
        if self.path:
            with sqlite3.connect(self.path) as db:
                found = list(db.execute(sql))
        else:
            found = self._pg(sql)
        out: dict[str, int] = {}
        for producer, n in found:
            kind = producer.split("/")[0] + ("/<i>" if "/" in producer else "")
            out[kind] = out.get(kind, 0) + int(n)
        return out

    def _pg(self, sql: str) -> list[Any]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            return list(db.execute(sql).fetchall())


class Sampler:
    """Every ``SAMPLE_S``: new sightings and injector marks, resolved against the journal before
    the replay window trims it; every minute one row of the table.

    It runs in a process of its own (``SamplerProcess``), not in the driver: parsing 10 s of
    sightings and the journal holds a Python interpreter's lock while it runs, and the
    driver's interpreter is the one that runs the injector, so a sampler thread there delays the
    publishes it measures (the first hop, and only that hop, whose producer is in the driver)."""

    def __init__(self, url: str, log_dir: str, minutes: int, driver_pid: int, done: Any,
                 on_row: Callable[[dict[str, Any]], None]) -> None:
        self.url, self.log_dir, self.on_row, self.driver_pid = url, log_dir, on_row, driver_pid
        self.store, self.size = open_store(url), Store(url)
        self.offsets: dict[str, int] = {}
        self.cut = 0  # injector batches published before this were measured for lag
        self.done, self.minute = done, 0
        self.started = time.time()
        self.unresolved = 0
        self.reference_rows: dict[str, int] = {}
        self.reference_mb: dict[str, float] = {}
        self.reference_minute = min(5, max(1, minutes // 4))
        self._reset()

    def _reset(self) -> None:
        self.hops: dict[str, list[float]] = {h: [] for h in HOPS}
        self.lags: list[float] = []
        self.late = 0

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S - (time.time() - self.started) % SAMPLE_S):
            self.sample(time.time() * 1000)
            if int((time.time() - self.started) // 60) > self.minute:
                self.row()

    def finish(self) -> None:
        self.sample(float("inf"))
        if self.hops[HOPS[0]]:
            self.row(partial=True)
        self.store.close()

    def new_sightings(self) -> list[tuple[str, str, float]]:
        out = []
        for path in glob.glob(os.path.join(self.log_dir, "*.seen")):
            stage = os.path.basename(path).split("-", 1)[0]
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            whole = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next sample
            self.offsets[path] = self.offsets.get(path, 0) + len(whole)
            for line in whole.decode().splitlines():
                parts = line.split()
                if len(parts) == 3:
                    out.append((stage, parts[0], float(parts[2])))
        return out

    def sample(self, now_ms: float) -> None:
        seen = self.new_sightings()
        wanted = {producer_batch(rid, "continuous")[0] for _, rid, _ in seen}
        completed = {(p, b.batch): b.completed_at for p in wanted for b in self.store.batches(p)}
        for stage, rid, at in seen:
            committed = completed.get(producer_batch(rid, "continuous"))
            if committed is None:
                self.unresolved += 1  # its batch was trimmed already (or a weak attempt's): not measured
                continue
            self.hops[HOPS[STAGES.index(stage)]].append(at - committed)
        marks = [(b.output_watermark, b.completed_at) for b in self.store.batches(INJECTOR)
                 if self.cut <= b.completed_at < now_ms - LAG_GRACE_MS and b.output_watermark < END_OF_TIME]
        if marks:
            lags = lag_of(marks, [self.store.batches(STAGES[-1])])
            self.lags += lags
            self.late += len(marks) - len(lags)
            self.cut = max(t for _, t in marks) + 1

    def row(self, partial: bool = False) -> None:
        self.minute += 1
        others = peak_rss_of_descendants(self.driver_pid, "VmRSS", skip=os.getpid())
        with open(f"/proc/{self.driver_pid}/status") as f:
            driver = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
        row: dict[str, Any] = {"minute": self.minute, "partial": partial, "store_mb": self.size.size_mb(),
                               "wal_mb": self.size.wal_mb()}
        for hop in HOPS:
            row[f"{hop} p50"], row[f"{hop} p99"] = pct(self.hops[hop], .5), pct(self.hops[hop], .99)
        row.update({"lag p50": pct(self.lags, .5), "lag max": max(self.lags, default=float("nan")),
                    "lag late": self.late, "driver_mb": driver,
                    "jvm_mb": sum(mb for name, mb in others if name == "JVM"),
                    "workers_mb": sum(mb for name, mb in others if name.startswith("python"))})
        if self.minute == self.reference_minute:
            self.reference_rows = self.size.rows()
            self.reference_rows.update({f"batches of {k}": v for k, v in self.size.journal().items()})
            self.reference_mb = self.size.table_mb()
        self._reset()
        self.on_row(row)


def sample_in_child(url: str, log_dir: str, minutes: int, driver_pid: int, done: Any, out: Any) -> None:
    """The sampler process's body: rows go to ``out`` as they are made, then the run's totals."""
    os.nice(10)  # measuring yields the CPU to what it measures
    sampler = Sampler(url, log_dir, minutes, driver_pid, done, lambda row: out.put(("row", row)))
    sampler.run()
    sampler.finish()
    out.put(("end", {"unresolved": sampler.unresolved, "reference_rows": sampler.reference_rows,
                     "reference_mb": sampler.reference_mb}))


class SamplerProcess:
    """``Sampler`` in a spawned process; the driver only prints the rows it sends."""

    def __init__(self, url: str, log_dir: str, minutes: int, on_row: Callable[[dict[str, Any]], None]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.done, self.out, self.on_row = ctx.Event(), ctx.Queue(), on_row
        self.process = ctx.Process(target=sample_in_child, args=(url, log_dir, minutes, os.getpid(), self.done,
                                                                 self.out), daemon=True)
        self.printer = threading.Thread(target=self._print, daemon=True)
        self.totals: dict[str, Any] = {}

    def start(self) -> None:
        self.process.start()
        self.printer.start()

    def _print(self) -> None:
        while True:
            try:
                kind, body = self.out.get(timeout=1.0)
            except queue.Empty:
                if self.process.is_alive():
                    continue
                raise RuntimeError(f"the sampler process ended ({self.process.exitcode}) without its totals")
            if kind == "end":
                self.totals = body
                return
            self.on_row(body)

    def finish(self) -> dict[str, Any]:
        self.done.set()
        self.printer.join()
        self.process.join()
        if not self.totals:
            raise RuntimeError(f"the sampler process ended ({self.process.exitcode}) without its totals")
        return self.totals


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
