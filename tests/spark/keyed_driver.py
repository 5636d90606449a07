"""The driver of test_keyed_delivery.py: ``python keyed_driver.py STORE_DIR COUNTS_DIR SLOTS...``.

On one local SparkSession with as many task slots as the largest count asked for, it runs a
two-stage topology in continuous mode once per count of worker slots (``ContinuousRunner``'s
``workers``), each on a store of its own. The second stage keys what the first produces with a
callable key extractor that appends a byte to ``COUNTS_DIR/<slots>`` each time it is called, from
whatever process calls it; it prints, as one JSON line per run, the records each stage produced.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from headrace import Computation, Topology, injectors, key_by, read
from headrace.spark.continuous import ContinuousRunner
from headrace.spark.session import spark_session

RECORDS = 2_000


class Tag(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("tagged", {"user": ctx.key, "n": record.value["n"], "bucket": record.value["n"] % 13})


class CountPerBucket(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("end", 10**12)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("counts", {"bucket": ctx.key, "n": ctx.state})


def counted(path: str) -> Any:
    def bucket_of(value: dict[str, Any]) -> str:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, b".")  # one byte a call, appended atomically whichever process calls
        finally:
            os.close(fd)
        return str(value["bucket"])
    return bucket_of


def topology(path: str) -> Topology:
    t = Topology("keyed")
    events = [{"user": f"u{i % 50}", "n": i, "ts": 1_000 + i} for i in range(RECORDS)]
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=100))
    t.add(Tag, inputs={"events": key_by("user")}, outputs=["tagged"], shards=16)
    t.add(CountPerBucket, inputs={"tagged": key_by(counted(path))}, outputs=["counts"], shards=16)
    return t


def main(store_dir: str, counts_dir: str, slots: list[int]) -> None:
    spark = spark_session(f"local[{max(slots) + 1}]", app_name="headrace-keyed", ui=False)
    for n in slots:
        url = f"sqlite:///{store_dir}/slots{n}.db"
        runner = ContinuousRunner(topology(os.path.join(counts_dir, str(n))), url, spark=spark, workers=n,
                                  ui=False).start()
        try:
            runner.wait(timeout_s=300)
        finally:
            runner.stop()
        print(json.dumps({"slots": n, "tagged": len(list(read("tagged", url))),
                          "counts": {r.value["bucket"]: r.value["n"] for r in read("counts", url)}}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3:]])
