"""A ``foreach_batch(fn)`` sink (``spark/sinks.py``): ``fn`` sees every record of the stream exactly
once across its batches, under increasing batch ids, and a restart without a failure delivers
nothing again (both execution modes)."""

from __future__ import annotations

import threading
from typing import Any

from headrace import Computation, Topology, injectors, key_by, read, run

N = 120


class Stamp(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("stamped", {"user": ctx.key, "n": record.value["n"]})


class Seen:
    """The sink's ``fn``: it runs on the driver, so it can note what each batch held."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[tuple[str, int, str, int]]]] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [(r.id, r.value.n, r.producer, r.batch) for r in df.collect()]
        with self._lock:
            self.batches.append((batch_id, rows))

    def ids(self) -> list[str]:
        return [row[0] for _, rows in self.batches for row in rows]


def build(seen: Seen) -> Topology:
    t = Topology("foreach")
    t.inject("events", injectors.records([{"user": f"u{i % 6}", "n": i, "ts": 1_000 + i} for i in range(N)],
                                         timestamp="ts", batch_size=20, rate=80))
    t.add(Stamp, inputs={"events": key_by("user")}, outputs=["stamped"], shards=2)
    t.stream("stamped", schema="user STRING, n BIGINT")
    t.sink("stamped", foreach_batch=seen)
    return t


def test_foreach_batch_sees_every_record_once_and_a_restart_delivers_nothing_again(
        spark: Any, store_url: str, mode: str) -> None:
    seen = Seen()
    run(build(seen), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    stream = {r.id: r.value["n"] for r in read("stamped", store_url)}
    assert len(stream) == N and sorted(stream.values()) == list(range(N))
    ids = seen.ids()
    assert sorted(ids) == sorted(stream), "every record of the stream, each once"
    assert {i: n for _, rows in seen.batches for i, n, _, _ in rows} == stream
    batch_ids = [b for b, _ in seen.batches]
    assert batch_ids == sorted(set(batch_ids)) and len(batch_ids) >= 2, f"increasing batch ids: {batch_ids}"
    # each (producer, stream batch) arrives whole in one sink batch
    where = {(p, b): batch_id for batch_id, rows in seen.batches for _, _, p, b in rows}
    assert all(where[(p, b)] == batch_id for batch_id, rows in seen.batches for _, _, p, b in rows)

    again = Seen()
    run(build(again), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    assert again.ids() == [], f"the restart delivered again: {again.batches}"
    assert all(b > batch_ids[-1] for b, _ in again.batches), "a restart goes on from the last batch id"
