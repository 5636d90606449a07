"""The soak's measuring side (``bench/soak.py``): the store's size and rows, and a sampler that
runs in a process of its own and sends the soak a row a minute."""

from __future__ import annotations

import collections
import glob
import multiprocessing
import os
import queue
import sqlite3
import threading
import time
from typing import Any, Callable

from percentiles import percentile
from pipeline_latency import INJECTOR, STAGES, lag_of, peak_rss_of_descendants, producer_batch

from headrace.model import END_OF_TIME
from headrace.store import open_store

HOPS = [f"{'inject' if k == 0 else STAGES[k - 1]}→{s}" for k, s in enumerate(STAGES)]
SAMPLE_S = 2.0
KEEP_JOURNAL_MS = 120_000  # a sighting comes well within this of its batch's commit
LAG_GRACE_MS = 10_000


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

    It runs in a process of its own (``SamplerProcess``), not in the driver: parsing a sample's
    sightings and the journal holds a Python interpreter's lock while it runs, and the
    driver's interpreter is the one that runs the injector, so a sampler thread there delays the
    publishes it measures (the first hop, and only that hop, whose producer is in the driver)."""

    def __init__(self, url: str, log_dir: str, minutes: int, driver_pid: int, done: Any,
                 on_row: Callable[[dict[str, Any]], None]) -> None:
        self.url, self.log_dir, self.on_row, self.driver_pid = url, log_dir, on_row, driver_pid
        self.store, self.size = open_store(url), Store(url)
        self.offsets: dict[str, int] = {}
        self.read_upto: dict[str, int] = {}  # per producer, the last journal row read
        self.completed: dict[tuple[str, int], int] = {}  # (producer, batch) -> completed_at, of the rows kept
        self.kept: collections.deque[tuple[int, tuple[str, int]]] = collections.deque()
        self.marks: list[tuple[int, int]] = []  # injector watermarks and their publish times, not yet measured
        self.last_stage: collections.deque[Any] = collections.deque()  # the last stage's journal rows kept
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

    def read_journals(self, producers: set[str], now_ms: float) -> None:
        """The journal rows each producer wrote since the last sample (each row is read once: a
        sampler that re-read whole journals took a quarter of a core-second every sample, in a
        burst that showed in the latencies it measured), kept for ``KEEP_JOURNAL_MS``."""
        for producer in sorted(producers | set(self.read_upto)):
            for b in self.store.batches(producer, after=self.read_upto.get(producer, 0)):
                self.completed[(producer, b.batch)] = b.completed_at
                self.kept.append((b.completed_at, (producer, b.batch)))
                self.read_upto[producer] = b.batch
                if producer == INJECTOR and b.output_watermark < END_OF_TIME:
                    self.marks.append((b.output_watermark, b.completed_at))
                elif producer == STAGES[-1]:
                    self.last_stage.append(b)
        while self.kept and self.kept[0][0] < now_ms - KEEP_JOURNAL_MS:
            self.completed.pop(self.kept.popleft()[1], None)
        while self.last_stage and self.last_stage[0].completed_at < now_ms - KEEP_JOURNAL_MS:
            self.last_stage.popleft()

    def sample(self, now_ms: float) -> None:
        seen = self.new_sightings()
        self.read_journals({producer_batch(rid, "continuous")[0] for _, rid, _ in seen} | {INJECTOR, STAGES[-1]},
                           min(now_ms, time.time() * 1000))
        for stage, rid, at in seen:
            committed = self.completed.get(producer_batch(rid, "continuous"))
            if committed is None:
                self.unresolved += 1  # its batch was trimmed already (or a weak attempt's): not measured
                continue
            self.hops[HOPS[STAGES.index(stage)]].append(at - committed)
        marks = [m for m in self.marks if m[1] < now_ms - LAG_GRACE_MS]
        if marks:
            self.marks = [m for m in self.marks if m[1] >= now_ms - LAG_GRACE_MS]
            lags = lag_of(marks, [list(self.last_stage)])
            self.lags += lags
            self.late += len(marks) - len(lags)

    def row(self, partial: bool = False) -> None:
        self.minute += 1
        others = peak_rss_of_descendants(self.driver_pid, "VmRSS", skip=os.getpid())
        with open(f"/proc/{self.driver_pid}/status") as f:
            driver = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
        row: dict[str, Any] = {"minute": self.minute, "partial": partial, "store_mb": self.size.size_mb(),
                               "wal_mb": self.size.wal_mb()}
        for hop in HOPS:
            row[f"{hop} p50"], row[f"{hop} p99"] = percentile(self.hops[hop], .5), percentile(self.hops[hop], .99)
        row.update({"lag p50": percentile(self.lags, .5), "lag max": max(self.lags, default=float("nan")),
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
