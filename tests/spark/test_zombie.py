from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from headrace import read, run
from headrace.monitor.events import fenced_events
from headrace.spark.continuous import ContinuousRunner
from headrace.store import open_store

from ..ci import long_only
from .zombie_topology import EVENTS, build


def test_a_second_driver_takes_over_and_every_write_of_the_first_is_refused(spark: Any, tmp_path: Path,
                                                                          each_store: str, mode: str) -> None:
    store = each_store
    if ("postgresql" in store) == (mode == "continuous"):
        long_only(f"{mode} on this store", covered_by="each store in one mode, each mode on one store")
    checkpoints, signals = tmp_path / "checkpoints", tmp_path / "signals"
    signals.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("HEADRACE_TEST_STALL_DIR", None)
    zombie = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zombie_topology.py")), store,
                               str(checkpoints), str(signals), mode], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not (signals / "stalled").exists():
            assert zombie.poll() is None, f"the first driver ended early: {zombie.stderr.read() if zombie.stderr else ''}"
            assert time.time() < deadline, "the first driver never reached its stall point"
            time.sleep(0.1)
        if mode == "microbatch":
            first_sequencer = open_store(store).sequencer("Counter")
            # the second driver: same topology, store and checkpoints; it takes over and finishes
            run(build(), store=store, spark=spark, checkpoint_dir=str(checkpoints), progress=None, timeout_s=300,
                mode=mode)
            assert open_store(store).sequencer("Counter") == first_sequencer + 1
            expected_error = (f"headrace.errors.FencedWriterError: Writer of 'Counter' with sequencer "
                              f"{first_sequencer} was fenced off: the store's sequencer is {first_sequencer + 1}")
        else:
            # the stalled worker renews no lease: a worker of the second driver takes its interval over, and
            # only then does the zombie's user code go on and try to commit
            first = open_store(store).interval_owners("Counter")
            second = ContinuousRunner(build(), store, spark=spark, progress=None).start()
            try:
                while any(o in (first[i][0], None) for i, (o, _, _) in open_store(store).interval_owners("Counter").items()):
                    second.check()
                    assert time.time() < deadline, "no worker of the second driver took the intervals over"
                    time.sleep(0.1)
                (signals / "resume").touch()
                second.wait(timeout_s=300)
            finally:
                second.stop()
            refused = {e["interval"]: e["message"] for e in fenced_events(open_store(store))}
            assert refused, "the zombie never tried to commit after the takeover"
            for interval, error in refused.items():  # refused by its sequencer, or by the batch the new owner made
                shard, sequencer = interval.split("/")[1], first[int(interval.split("/")[1])][2]
                assert (f"Writer of 'Counter' with sequencer {sequencer} was fenced off" in error
                        or f"Interval {shard} of 'Counter' already has batch" in error), error
            expected_error = "of topology 'zombie' was superseded (got 'newer driver "
        before = {r.id: r.value for r in read("counts", store)}
        versions = open_store(store).shard_versions("Counter")

        (signals / "resume").touch()
        _, err = zombie.communicate(timeout=240)
    finally:
        if zombie.poll() is None:
            zombie.kill()
    assert zombie.returncode == 3, err
    assert expected_error in err, err
    # nothing the zombie attempted after the takeover is visible
    assert {r.id: r.value for r in read("counts", store)} == before
    assert open_store(store).shard_versions("Counter") == versions
    assert {v["user"]: v["n"] for v in before.values()} == dict(Counter(e["user"] for e in EVENTS))
