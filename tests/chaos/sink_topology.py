"""The pipeline the sink chaos test kills: an injector, one computation producing a typed stream,
and a sink of that stream (a Parquet file sink or a JDBC table).

As a script it is one driver life:
``python sink_topology.py STORE_URL N MODE parquet PATH``, ``... MODE jdbc JDBC_URL TABLE``,
``... MODE delta PATH`` or ``... MODE iceberg NAMESPACE.TABLE WAREHOUSE``.
"""

from __future__ import annotations

import sys
from typing import Any

from headrace import Computation, Topology, injectors, key_by

BASE = 1_700_000_000_000
USERS = [f"user-{i}" for i in range(8)]


def events(n: int) -> list[dict[str, Any]]:
    return [{"user": USERS[i % len(USERS)], "n": i, "ts": BASE + i * 5} for i in range(n)]


class Stamp(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("stamped", {"user": ctx.key, "n": record.value["n"]})


def build(n: int, sink: list[str], rate: float = 150) -> Topology:
    t = Topology("sinks")
    t.inject("events", injectors.records(events(n), timestamp="ts", batch_size=30, rate=rate))
    t.add(Stamp, inputs={"events": key_by("user")}, outputs=["stamped"], shards=2)
    t.stream("stamped", schema="user STRING, n BIGINT")
    if sink[0] == "parquet":
        t.sink("stamped", format="parquet", path=sink[1])
    elif sink[0] == "delta":
        t.sink("stamped", delta=sink[1])
    elif sink[0] == "iceberg":
        t.sink("stamped", iceberg=sink[1], warehouse=sink[2])
    else:  # a small JDBC batch size: rows are inserted, uncommitted, while the write task goes on
        t.sink("stamped", jdbc=sink[1], table=sink[2], properties={"batchsize": "20"})
    return t


if __name__ == "__main__":
    from headrace import run

    store, n, mode, sink = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    run(build(n, sink), store=store, master="local[2,100]", progress=None, mode=mode)
    print("drained", flush=True)
