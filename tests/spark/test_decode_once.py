"""In micro-batch mode each value is unpickled once on its way to user code: its producer keyed it
(keyed delivery), and the task that runs its shard's batch decodes it, once.
Each value counts its unpickling in a file every process appends to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from headrace import Computation, Topology, injectors, key_by, run

RECORDS = 300


def _rebuild(path: str, fields: dict[str, Any]) -> "Counted":
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, b".")  # one byte per unpickling, whichever process unpickles
    finally:
        os.close(fd)
    return Counted(path, fields)


class Counted(dict):  # type: ignore[type-arg]
    """A dict that counts how often it is unpickled."""

    def __init__(self, path: str, fields: dict[str, Any]):
        super().__init__(fields)
        self.path = path

    def __reduce__(self) -> Any:
        return (_rebuild, (self.path, dict(self)))


class CountPerUser(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def test_micro_batch_unpickles_each_value_once(spark: Any, tmp_path: Path) -> None:
    counts = str(tmp_path / "unpickled")
    events = [Counted(counts, {"user": f"u{i % 11}", "ts": 1_000 + i}) for i in range(RECORDS)]
    t = Topology("decode_once")
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=50))
    t.add(CountPerUser, inputs={"events": key_by("user")}, shards=3)
    run(t, store=f"sqlite:///{tmp_path}/store.db", spark=spark, progress=None, timeout_s=300, mode="microbatch")
    assert os.path.getsize(counts) == RECORDS
