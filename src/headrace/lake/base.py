"""The writer every lakehouse sink shares (``LakeSink``): fence check, last written batches, commit
against the snapshot read; the package's docstring says why."""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FencedWriterError
from ..store import Store, open_store
from ..store.failpoints import failpoint_from_env

__all__ = ["LakeSink", "batches_of", "unwritten"]


def batches_of(rows: pa.Table) -> dict[str, int]:
    """Per producer, the last batch among ``rows``."""
    if rows.num_rows == 0:
        return {}
    grouped = rows.group_by("producer").aggregate([("batch", "max")])
    return {str(p): int(b) for p, b in zip(grouped["producer"].to_pylist(), grouped["batch_max"].to_pylist())}


def unwritten(rows: pa.Table, written: dict[str, int]) -> pa.Table:
    """The rows of batches past each producer's last written one."""
    if not written:
        return rows
    done = pa.array([written.get(p, -1) for p in rows["producer"].to_pylist()], pa.int64())
    return rows.filter(pc.greater(rows["batch"], done))


class LakeSink:
    """One sink's writer (one per driver): subclasses read the last written batches from a
    snapshot of the table and commit against it."""

    kind = ""

    def __init__(self, name: str, store_url: str, store: Store | None = None):
        self.name = name
        self.store = store if store is not None else open_store(store_url, name="headrace-sink")
        self.owns_store = store is None
        self.sequencer = self.store.acquire_sink_writer(name)
        self.failpoint = failpoint_from_env()

    def write(self, rows: pa.Table) -> int:
        """Write the rows of batches not yet in the table; how many rows it wrote."""
        if rows.num_rows == 0:
            return 0
        self.check_fence()
        snapshot = self.snapshot(rows.schema)
        producers = sorted(set(rows["producer"].to_pylist()))
        fresh = unwritten(rows, self.written(snapshot, producers))
        if fresh.num_rows == 0:
            return 0
        self.commit(snapshot, fresh, batches_of(fresh))
        return fresh.num_rows

    def check_fence(self) -> None:
        current = self.store.sink_writer(self.name)
        if current != self.sequencer:
            raise FencedWriterError(f"The {self.kind} sink {self.name!r} has a newer writer", got=current,
                                    hint=f"this writer is {self.sequencer}: another driver took the sink over, "
                                         "and this one stops without writing")

    def lost_race(self, error: Exception) -> FencedWriterError:
        return FencedWriterError(f"The {self.kind} sink {self.name!r} lost its commit to another writer",
                                 got_text=str(error).splitlines()[0][:200],
                                 hint="a newer writer committed batches this one was writing; this one stops, "
                                      "and the table holds each batch once")

    def stream(self, rows: pa.Table) -> pa.RecordBatchReader:
        """``rows`` as a stream the library writes data files from while it reads it: the
        ``lake_commit`` failpoint sleeps after the first half, with files being written and
        nothing committed."""
        half = max(1, rows.num_rows // 2)

        def parts() -> Iterator[pa.RecordBatch]:
            yield from rows.slice(0, half).to_batches()
            if self.failpoint is not None:
                self.failpoint("lake_commit")
            yield from rows.slice(half).to_batches()

        return pa.RecordBatchReader.from_batches(rows.schema, parts())

    def snapshot(self, schema: pa.Schema) -> Any:
        """The table as it is now, made empty with ``schema`` first if it does not exist (so even the
        first commit is made against a snapshot another writer's commit makes stale)."""
        raise NotImplementedError

    def written(self, snapshot: Any, producers: list[str]) -> dict[str, int]:
        raise NotImplementedError

    def commit(self, snapshot: Any, rows: pa.Table, batches: dict[str, int]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self.owns_store:
            self.store.close()
