"""Recovery time after a kill, in micro-batch mode and in continuous mode.

    .venv/bin/python bench/recovery.py [--mode microbatch,continuous] [--kills 3] [--worker-kills 2] [--rate 2000]

A two-stage pipeline (a keyed windowed counter with watermark timers, then a per-window total)
runs from a generator injector in a driver subprocess. Once it is in steady state:

- **the driver is killed** (SIGKILL of its whole process group: driver, JVM, Python workers), and
  the same command is started again on the same store (and, in micro-batch mode, checkpoints).
  Reported per kill, next to the cold start of the first driver measured in the same run:
  *first commit*, from the kill until a computation commits again (micro-batch: the computation
  journals its next batch; continuous: any key interval ``C/<i>`` journals its next batch), and
  *caught up*, until the last stage's low watermark is back within 2 s (+ one window) of the
  injector's. Both include starting the new driver: Spark, the JVM, the queries or the workers;
- **one continuous worker is killed** (continuous mode only; ``--worker-kills``): SIGKILL of the
  Python process of the worker that owns interval 0 of the first stage (its pid is in the store's
  meta row ``worker:<run_id>:<owner>``). Reported per kill, from the kill: when every interval it
  owned had a new owner (``store.interval_owners``, polled every 10 ms), and when each of them
  committed again (the first batch of its ``C/<i>`` journal completed after the kill), the median
  and the slowest; and what happened to the other worker's intervals (how long until they
  committed again, whether they changed owner) and how many workers started after the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from window_counter import WindowCounter  # noqa: E402

from headrace import Computation, Topology, injectors, key_by  # noqa: E402
from headrace.store import open_store  # noqa: E402

STAGES = ("WindowCounter", "Totals")
SHARDS = 4
MODES = ("microbatch", "continuous")


class Totals(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + record.value["count"]


def build(rate: float) -> Topology:
    def make(i: int) -> dict[str, Any]:
        return {"user": f"u{i % 5_000}", "ts": int(time.time() * 1000) - i % 300}

    t = Topology("recovery")
    t.inject("events", injectors.generator(make, int(rate * 3_600), timestamp="ts", rate=rate,
                                           batch_size=max(1, int(rate / 5)), max_delay_ms=300))
    t.add(WindowCounter, inputs={"events": key_by("user")}, outputs=["windows"], shards=SHARDS)
    t.add(Totals, inputs={"windows": key_by(lambda v: str(v["bucket"]))}, shards=SHARDS)
    return t


def drive(store: str, checkpoints: str, rate: float, mode: str) -> None:
    from headrace import run

    run(build(rate), store=store, master="local[2]", checkpoint_dir=checkpoints if mode == "microbatch" else None,
        progress=None, mode=mode)


def heads(store_url: str) -> dict[str, Any]:
    try:
        store = open_store(store_url)
    except Exception:
        return {}
    try:
        return {b.producer: b for b in store.journal_heads()}
    finally:
        store.close()


def committed(store_url: str, mode: str) -> int:
    """How many batches the first stage has committed: its journal in micro-batch mode, the sum
    over its intervals' journals in continuous mode (there, ``C`` is the watermark authority's)."""
    h = heads(store_url)
    if mode == "microbatch":
        return h[STAGES[0]].batch if STAGES[0] in h else 0
    return sum(h[f"{STAGES[0]}/{i}"].batch for i in range(SHARDS) if f"{STAGES[0]}/{i}" in h)


def wait(predicate: Any, timeout_s: float = 300, poll_s: float = 0.05) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError("the pipeline did not get there in time")
        time.sleep(poll_s)
    return time.perf_counter() - start


def caught_up(store_url: str) -> bool:
    h = heads(store_url)
    if "inject:events" not in h or STAGES[-1] not in h:
        return False
    return h["inject:events"].output_watermark - h[STAGES[-1]].input_watermark < 2_000 + 1_000  # + one window


def now_ms() -> float:
    return time.time() * 1000


def kill_one_worker(store_url: str, kill: int, watch_s: float) -> str:
    """SIGKILL the Python process of the continuous worker that owns interval 0 of the first stage,
    watch every interval for ``watch_s`` seconds (longer if the killed worker's intervals have not
    committed again by then), and say how they came back."""
    store = open_store(store_url)
    try:
        before = {c: store.interval_owners(c) for c in STAGES}
        victim = before[STAGES[0]][0][0]
        # worker:<topology>:<run>:<owner>, the owner <host>:<pid>:task<slot>.<attempt>
        pids = {name.split(":", 3)[3]: json.loads(value)["pid"] for name, value in store.metas("worker:").items()}
        if victim is None or victim not in pids:
            raise RuntimeError(f"interval 0 of {STAGES[0]} has no live owner with a pid: {before[STAGES[0]]}")
        pid = pids[victim]
        mine = [(c, i) for c in STAGES for i, (owner, _, _) in before[c].items() if owner == victim]
        others = [(c, i) for c in STAGES for i, (owner, _, _) in before[c].items() if owner != victim]
        workers_before = set(pids)
        os.kill(pid, signal.SIGKILL)
        killed_at = now_ms()
        new_owner: dict[tuple[str, int], float] = {}
        changed: set[tuple[str, int]] = set()
        deadline = time.time() + 120
        while True:
            owners = {c: store.interval_owners(c) for c in STAGES}
            at = now_ms() - killed_at
            for c, i in mine + others:
                owner = owners[c][i][0]
                if owner is not None and owner != before[c][i][0]:
                    changed.add((c, i))
                    new_owner.setdefault((c, i), at)
            back = all((c, i) in new_owner and _next_commit(store, c, i, killed_at) for c, i in mine)
            if back and at >= watch_s * 1000:
                break
            if time.time() > deadline:
                raise TimeoutError(f"the killed worker's intervals {mine} did not commit again within 120 s")
            time.sleep(0.01)
        ended = now_ms()
        next_commit = [_next_commit(store, c, i, killed_at) - killed_at for c, i in mine]  # type: ignore[operator]
        pause = {(c, i): _longest_pause(store, c, i, killed_at, ended) for c, i in mine + others}
        started = [o for o in store.metas("worker:") if o.split(":", 3)[3] not in workers_before]
    finally:
        store.close()
    moved = [x for x in others if x in changed]
    text = (f"worker kill {kill}: pid {pid} owned {len(mine)} intervals ({_names(mine)}): all had a new owner after "
            f"{max(new_owner[x] for x in mine) / 1000:.2f} s; next commit p50 {statistics.median(next_commit) / 1000:.2f} s, "
            f"slowest {max(next_commit) / 1000:.2f} s.")
    if others:
        text += (f"\n    the other {len(others)} intervals, in the {(ended - killed_at) / 1000:.1f} s after the kill: "
                 f"longest pause between commits {max(pause[x] for x in others) / 1000:.2f} s; {len(moved)} changed "
                 f"owner" + (f" (new owner after {max(new_owner[x] for x in moved) / 1000:.2f} s)" if moved else "") +
                 f"; workers started after the kill: {len(started)}")
    return text


def _longest_pause(store: Any, computation: str, interval: int, since_ms: float, until_ms: float) -> float:
    """The longest time interval ``interval`` of ``computation`` went without a commit in (since, until]."""
    producer = f"{computation}/{interval}"
    times = [since_ms] + [b.completed_at for b in store.batches(producer, store.batch_before(producer, int(since_ms) + 1))
                          if since_ms < b.completed_at <= until_ms] + [until_ms]
    return max(b - a for a, b in zip(times, times[1:]))


def _next_commit(store: Any, computation: str, interval: int, after_ms: float) -> float | None:
    """When interval ``interval`` of ``computation`` first journaled a batch after ``after_ms``."""
    producer = f"{computation}/{interval}"
    info = store.batch_info(producer, store.batch_before(producer, int(after_ms) + 1) + 1)
    return None if info is None else float(info.completed_at)


def _names(intervals: list[tuple[str, int]]) -> str:
    return ", ".join(f"{c}/{i}" for c, i in intervals)


def measure_mode(mode: str, args: Any) -> None:
    folder = tempfile.mkdtemp(prefix=f"headrace-recovery-{mode}-")
    store, checkpoints = f"sqlite:///{folder}/store.db", f"{folder}/checkpoints"
    log = open(f"{folder}/drivers.log", "a")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, __file__, "--rate", str(args.rate), "--drive", store, checkpoints,
                                 "--drive-mode", mode], env=env, stdout=log, stderr=log, start_new_session=True)

    print(f"\n{mode}: {args.rate:,.0f} records/s, two stages of {SHARDS} shards, exactly-once, SQLite store "
          f"({folder})", flush=True)
    driver = start()
    try:
        cold_first = wait(lambda: committed(store, mode) > 0)
        cold_caught = cold_first + wait(lambda: caught_up(store))
        print(f"{'':<22} {'first commit s':>15} {'caught up s':>12}")
        print(f"{'cold start':<22} {cold_first:>15.1f} {cold_caught:>12.1f}", flush=True)
        if mode == "continuous":
            for k in range(args.worker_kills):
                time.sleep(10)  # steady state
                print("  " + kill_one_worker(store, k + 1, args.watch), flush=True)
                wait(lambda: caught_up(store))
        for k in range(args.kills):
            time.sleep(10)  # steady state
            before = committed(store, mode)
            os.killpg(driver.pid, signal.SIGKILL)
            killed = time.perf_counter()
            driver.wait()
            driver = start()
            wait(lambda: committed(store, mode) > before)
            first = time.perf_counter() - killed
            caught = first + wait(lambda: caught_up(store))
            print(f"{f'after driver kill {k + 1}':<22} {first:>15.1f} {caught:>12.1f}   "
                  f"({first / cold_first:.2f}x and {caught / cold_caught:.2f}x the cold start)", flush=True)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="microbatch,continuous", help="comma-separated: microbatch, continuous")
    parser.add_argument("--kills", type=int, default=3, help="driver kills per mode")
    parser.add_argument("--worker-kills", type=int, default=2, help="continuous mode: worker kills")
    parser.add_argument("--watch", type=float, default=12, help="continuous mode: seconds watched after a worker kill")
    parser.add_argument("--rate", type=float, default=2_000)
    parser.add_argument("--drive", nargs=2, metavar=("STORE", "CHECKPOINTS"), help=argparse.SUPPRESS)
    parser.add_argument("--drive-mode", default="microbatch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        store, checkpoints = args.drive
        drive(store, checkpoints, args.rate, args.drive_mode)
        return
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}: use {', '.join(MODES)}")
    print(f"machine: {os.cpu_count()} cores; Spark local[2]; a kill is a SIGKILL; times are from the kill "
          f"(the cold start: from the driver's start)")
    for mode in modes:
        measure_mode(mode, args)


if __name__ == "__main__":
    main()
