"""``foreachBatch`` of a Delta or Iceberg sink (``headrace/lake``): the batch's rows, collected to
the driver as Arrow, go to the sink's writer, which skips the (producer, batch) pairs the table
already holds and refuses to commit once a newer driver took the sink over."""

from __future__ import annotations

from typing import Any

from ..lake import LakeSink, open_lake_sink
from ..topology import SinkSpec

__all__ = ["LAKE_KINDS", "LakeWrite"]

LAKE_KINDS = ("delta", "iceberg")


class LakeWrite:
    def __init__(self, spec: SinkSpec, store_url: str, typed: bool):
        target = spec.delta if spec.kind == "delta" else spec.iceberg
        assert target is not None  # Topology.sink requires it of its kind
        self.typed = typed
        self.sink: LakeSink = open_lake_sink(spec.kind, spec.name, store_url, target, spec.warehouse)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("key", *(["value.*"] if self.typed else ["value"]), "timestamp", "id", "producer", "batch")
        self.sink.write(rows.toArrow())

    def close(self) -> None:
        self.sink.close()
