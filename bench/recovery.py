"""Recovery time after the driver is killed (SIGKILL of its whole process group: driver, JVM, workers).

    .venv/bin/python bench/recovery.py [--kills 3] [--rate 2000]

A two-stage pipeline (a keyed windowed counter with watermark timers, then a per-window total)
runs from a generator injector in a driver subprocess. Once it is in steady state the driver is
killed, and the same command is started again on the same store and checkpoints. Reported, per
kill, next to the cold start of the first driver measured in the same run:

- *first commit*: from the restart until the computation journals its first new batch (Spark and
  the JVM start, the query's checkpoint is read, the interrupted batch is retried or re-delivered);
- *caught up*: until the last stage's low watermark is back within 2 s of the injector's.
"""

from __future__ import annotations

import argparse
import os
import signal
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


class Totals(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + record.value["count"]


def build(rate: float) -> Topology:
    def make(i: int) -> dict[str, Any]:
        return {"user": f"u{i % 5_000}", "ts": int(time.time() * 1000) - i % 300}

    t = Topology("recovery")
    t.inject("events", injectors.generator(make, int(rate * 3_600), timestamp="ts", rate=rate,
                                           batch_size=max(1, int(rate / 5)), max_delay_ms=300))
    t.add(WindowCounter, inputs={"events": key_by("user")}, outputs=["windows"])
    t.add(Totals, inputs={"windows": key_by(lambda v: str(v["bucket"]))})
    return t


def drive(store: str, checkpoints: str, rate: float) -> None:
    from headrace import run

    run(build(rate), store=store, master="local[2]", checkpoint_dir=checkpoints, progress=None)


def heads(store_url: str) -> dict[str, Any]:
    try:
        store = open_store(store_url)
    except Exception:
        return {}
    try:
        return {b.producer: b for b in store.journal_heads()}
    finally:
        store.close()


def wait(predicate: Any, timeout_s: float = 300) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError("the pipeline did not get there in time")
        time.sleep(0.05)
    return time.perf_counter() - start


def caught_up(store_url: str) -> bool:
    h = heads(store_url)
    if "inject:events" not in h or STAGES[-1] not in h:
        return False
    return h["inject:events"].output_watermark - h[STAGES[-1]].input_watermark < 2_000 + 1_000  # + one window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2_000)
    parser.add_argument("--drive", nargs=2, metavar=("STORE", "CHECKPOINTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(*args.drive, args.rate)
        return
    folder = tempfile.mkdtemp(prefix="headrace-recovery-")
    store, checkpoints = f"sqlite:///{folder}/store.db", f"{folder}/checkpoints"
    log = open(f"{folder}/drivers.log", "a")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, __file__, "--rate", str(args.rate), "--drive", store, checkpoints],
                                env=env, stdout=log, stderr=log, start_new_session=True)

    print(f"machine: {os.cpu_count()} cores; {args.rate:,.0f} records/s, two stages, exactly-once, SQLite store")
    driver = start()
    cold_first = wait(lambda: STAGES[0] in heads(store))
    cold_caught = cold_first + wait(lambda: caught_up(store))
    print(f"{'':<16} {'first commit s':>15} {'caught up s':>12}")
    print(f"{'cold start':<16} {cold_first:>15.1f} {cold_caught:>12.1f}")
    try:
        for k in range(args.kills):
            time.sleep(10)  # steady state
            before = heads(store)[STAGES[0]].batch
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            driver = start()
            first = wait(lambda: heads(store)[STAGES[0]].batch > before)
            caught = first + wait(lambda: caught_up(store))
            print(f"{f'after kill {k + 1}':<16} {first:>15.1f} {caught:>12.1f}   "
                  f"({first / cold_first:.2f}x and {caught / cold_caught:.2f}x the cold start)")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    print(f"store and logs: {folder}")


if __name__ == "__main__":
    main()
