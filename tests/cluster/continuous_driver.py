"""A driver on a standalone cluster: ``python continuous_driver.py MASTER_URL STORE_URL``.

It runs a continuous topology until every slot's worker has committed, then prints (as one JSON
line) what the workers wrote about their TaskContext and what Spark's status tracker says of the
background job, stops, and says whether the job ended on its own."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

from headrace import Computation, Topology, injectors, key_by
from headrace.names import interval as interval_producer, meta
from headrace.spark.continuous import JOB_GROUP, ContinuousRunner
from headrace.spark.session import spark_session
from headrace.store import open_store

SHARDS = 4


class CountPerKey(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def event(i: int) -> dict[str, Any]:
    return {"key": f"k{i % 17}", "ts": 1_700_000_000_000 + 10 * i}


def main(master: str, store_url: str) -> dict[str, Any]:
    spark = spark_session(master, app_name="headrace-cluster-test", conf={"spark.executor.memory": "512m"})
    topology = Topology("on_a_cluster")
    topology.inject("events", injectors.generator(event, count=None, timestamp="ts", rate=200, batch_size=20))
    topology.add(CountPerKey, inputs={"events": key_by("key")}, outputs=[], shards=SHARDS)
    tracker = spark.sparkContext.statusTracker()
    # every core a worker: no progress query to leave a slot to
    runner = ContinuousRunner(topology, store_url, spark=spark, progress=None, progress_queries=False).start()
    store = open_store(store_url)
    report: dict[str, Any] = {"driver": {"host": socket.gethostname(), "pid": os.getpid()}, "slots": runner.slots()}
    try:
        deadline = time.time() + 180
        producers = [interval_producer("CountPerKey", i) for i in range(SHARDS)]
        while True:
            runner.check()
            prefix = meta.worker(topology.name, runner.run_id)
            rows = {k[len(prefix):]: json.loads(v) for k, v in store.metas(prefix).items()}
            owners = {o for o, _, _ in store.interval_owners("CountPerKey").values()}
            commits = sum(store.latest_batches(producers).values())
            if len(rows) >= report["slots"] and owners == set(rows) and commits >= 2 * SHARDS:
                break
            if time.time() > deadline:
                raise TimeoutError(f"workers {rows}, owners {owners}, commits {commits}")
            time.sleep(0.2)
        def active() -> dict[int, int]:
            return {s: tracker.getStageInfo(s).numActiveTasks
                    for j in tracker.getJobIdsForGroup(JOB_GROUP) for s in tracker.getJobInfo(j).stageIds}
        while sum(active().values()) < report["slots"] and time.time() < deadline:
            time.sleep(0.2)  # the status tracker follows Spark's listener bus, a little behind the tasks
        jobs = list(tracker.getJobIdsForGroup(JOB_GROUP))
        report.update(workers=rows, jobs=[{"id": j, "status": tracker.getJobInfo(j).status,
                                           "stages": list(tracker.getJobInfo(j).stageIds)} for j in jobs])
        report["active_tasks"] = active()
    finally:
        runner.stop()
    time.sleep(1)
    report["ended"] = {j["id"]: tracker.getJobInfo(j["id"]).status for j in report["jobs"]}
    store.close()
    spark.stop()
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])), flush=True)
