"""A topology whose user code stalls in one process (the zombie) until told to go on.

Run as a script, it is a driver: ``python zombie_topology.py STORE_URL CHECKPOINT_DIR SIGNAL_DIR MODE``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from headrace import Computation, Topology, injectors, key_by

EVENTS = [{"user": f"u{i % 5}", "n": i, "ts": 1_000 + i} for i in range(600)]


class StallingCounter(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        signals = os.environ.get("HEADRACE_TEST_STALL_DIR")
        if signals and record.value["n"] >= 300:
            open(os.path.join(signals, "stalled"), "w").close()
            deadline = time.time() + 600
            while not os.path.exists(os.path.join(signals, "resume")) and time.time() < deadline:
                time.sleep(0.05)
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("end", 100_000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("counts", {"user": ctx.key, "n": ctx.state})


def build() -> Topology:
    t = Topology("zombie")
    t.inject("events", injectors.records(EVENTS, timestamp="ts", batch_size=50, rate=400))
    t.add(StallingCounter, name="Counter", inputs={"events": key_by(lambda v: v["user"])}, outputs=["counts"])
    return t


if __name__ == "__main__":
    from headrace import run

    store, checkpoints, signals, mode = sys.argv[1:5]
    os.environ["HEADRACE_TEST_STALL_DIR"] = signals
    options = {"checkpoint_dir": checkpoints} if mode == "microbatch" else {}
    try:
        run(build(), store=store, master="local[1]", progress=None, timeout_s=600, mode=mode, **options)
    except Exception as exc:
        print(f"zombie stopped: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
