"""The Delta sink (delta-rs): one application transaction per producer, ``headrace:<sink>:<producer>``,
whose version is the last batch of that producer the table holds (``lake/__init__.py``)."""

from __future__ import annotations

import os

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from ..names import lake_app_id
from ..store import Store
from .base import LakeSink

__all__ = ["DeltaSink", "WRITER_KEY"]

WRITER_KEY = "headrace.writer"  # commit info: the sink and sequencer of the writer of each version


class DeltaSink(LakeSink):
    kind = "Delta"

    def __init__(self, name: str, store_url: str, path: str, store: Store | None = None):
        super().__init__(name, store_url, store)
        self.path = os.path.abspath(path) if "://" not in path else path

    def snapshot(self, schema: pa.Schema) -> DeltaTable:
        try:
            return DeltaTable(self.path)
        except TableNotFoundError:
            DeltaTable.create(self.path, schema, mode="ignore")
            return DeltaTable(self.path)

    def written(self, snapshot: DeltaTable, producers: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for producer in producers:
            version = snapshot.transaction_version(lake_app_id(self.name, producer))
            if version is not None:
                out[producer] = version
        return out

    def commit(self, snapshot: DeltaTable, rows: pa.Table, batches: dict[str, int]) -> None:
        properties = CommitProperties(
            custom_metadata={WRITER_KEY: f"{self.name}:{self.sequencer}"},
            app_transactions=[Transaction(lake_app_id(self.name, p), b) for p, b in sorted(batches.items())])
        try:  # against the snapshot the batches were read from: a commit in between of the same producers fails
            write_deltalake(snapshot, self.stream(rows), mode="append",
                            commit_properties=properties)
        except CommitFailedError as exc:
            raise self.lost_race(exc) from exc
