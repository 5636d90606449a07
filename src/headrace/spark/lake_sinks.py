"""``foreachBatch`` of a Delta or Iceberg sink (``headrace/lake``): the batch's rows, collected to
the driver as Arrow, go to the sink's writer, which skips the (producer, batch) pairs the table
already holds and refuses to commit once a newer driver took the sink over."""

from __future__ import annotations

from typing import Any

from ..errors import OptionError
from ..lake import LakeSink, open_lake_sink
from ..sinkspec import SinkSpec

__all__ = ["LAKE_KINDS", "LakeWrite"]

LAKE_KINDS = ("delta", "iceberg")
RECORD_COLUMNS = ("key", "timestamp", "id", "producer", "batch")


class LakeWrite:
    def __init__(self, spec: SinkSpec, store_url: str, fields: list[str] | None):
        """``fields``: the names of the stream's typed value, spread into columns (None: untyped)."""
        clash = sorted({f.lower() for f in fields or []} & set(RECORD_COLUMNS))
        if clash:  # the tables' column names are case-insensitive
            raise OptionError(f"The {spec.kind} sink {spec.name!r} cannot put the fields of stream {spec.stream!r} "
                              "beside the record's own columns", got=clash,
                              hint=f"rename them in the stream's schema: each row has {list(RECORD_COLUMNS)} "
                                   "besides the value's fields")
        target = spec.delta if spec.kind == "delta" else spec.iceberg
        assert target is not None  # Topology.sink requires it of its kind
        self.typed = fields is not None
        self.sink: LakeSink = open_lake_sink(spec.kind, spec.name, store_url, target, spec.warehouse)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("key", *(["value.*"] if self.typed else ["value"]), "timestamp", "id", "producer", "batch")
        self.sink.write(rows.toArrow())

    def close(self) -> None:
        self.sink.close()
