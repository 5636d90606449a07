"""The Iceberg sink (pyiceberg): a SQL catalog in the store's own database (SQLite or
PostgreSQL), tables under a warehouse directory; each snapshot the sink commits carries, in its
summary, the last batch per producer the table holds (``headrace.<sink>.batches``, JSON)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table, TableProperties

from ..errors import OptionError
from ..names import lake_stamp
from ..store import Store
from .base import LakeSink

__all__ = ["IcebergSink", "catalog_of", "WRITER_PROPERTY"]

CATALOG = "headrace"
WRITER_PROPERTY = "headrace.writer"
# Retries would rebase the append on a newer snapshot, past the batches a zombie did not re-read.
NO_RETRIES = {TableProperties.COMMIT_NUM_RETRIES: "0"}


def catalog_url(store_url: str) -> str:
    """The SQLAlchemy URL of the store's database."""
    parts = urlsplit(store_url)
    if parts.scheme == "sqlite":
        return store_url.split("?", 1)[0]
    if parts.scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg://" + store_url.split("://", 1)[1]
    raise OptionError("An Iceberg sink keeps its catalog in the store's database", got=parts.scheme,
                      hint="use a sqlite:/// or postgresql:// store")


def catalog_of(store_url: str, warehouse: str) -> SqlCatalog:
    """The SQL catalog in the store's database (tables ``iceberg_tables`` and
    ``iceberg_namespace_properties``), as pyiceberg, Spark's Iceberg jars or DuckDB can open it."""
    location = warehouse if "://" in warehouse else "file://" + os.path.abspath(warehouse)
    return SqlCatalog(CATALOG, uri=catalog_url(store_url), warehouse=location)


def stamped(table: Table, sink: str) -> dict[str, int]:
    """The last batch per producer the sink's newest snapshot in the table's ancestry records."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        value = snapshot.summary.additional_properties.get(lake_stamp(sink)) if snapshot.summary else None
        if value is not None:
            return {str(p): int(b) for p, b in json.loads(value).items()}
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return {}


class IcebergSink(LakeSink):
    kind = "Iceberg"

    def __init__(self, name: str, store_url: str, identifier: str, warehouse: str, store: Store | None = None):
        if "." not in identifier:
            raise OptionError(f"Sink {name!r}: an Iceberg table is named namespace.table", got=identifier,
                              hint="iceberg='analytics.anomalies'")
        if not warehouse:
            raise OptionError(f"Sink {name!r}: an Iceberg sink needs warehouse=", got=warehouse,
                              hint="warehouse='/data/warehouse' (where the table's files go)")
        super().__init__(name, store_url, store)
        self.identifier = identifier
        self.catalog = catalog_of(store_url, warehouse)
        logging.getLogger("pyiceberg").setLevel(logging.ERROR)
        table = self.loaded()  # a table made elsewhere: no retries from now on (not mid-write, where
        if table is not None and table.metadata.properties.get(TableProperties.COMMIT_NUM_RETRIES) != "0":
            with table.transaction() as tx:  # it would move the table past the snapshot read)
                tx.set_properties(NO_RETRIES)

    def loaded(self) -> Table | None:
        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def snapshot(self, schema: pa.Schema) -> Table:
        table = self.loaded()
        return table if table is not None else self.create(schema)

    def written(self, snapshot: Table, producers: list[str]) -> dict[str, int]:
        return stamped(snapshot, self.name)

    def commit(self, table: Table, rows: pa.Table, batches: dict[str, int]) -> None:
        before = stamped(table, self.name)
        properties = {lake_stamp(self.name): json.dumps({**before, **batches}, sort_keys=True),
                      WRITER_PROPERTY: f"{self.name}:{self.sequencer}"}
        try:
            table.append(self.stream(rows) if table.spec().is_unpartitioned() else rows,
                         snapshot_properties=properties)
        except CommitFailedException as exc:
            raise self.lost_race(exc) from exc

    def create(self, schema: pa.Schema) -> Table:
        namespace = self.identifier.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        return self.catalog.create_table_if_not_exists(self.identifier, schema=schema, properties=NO_RETRIES)

    def close(self) -> None:
        engine: Any = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
        super().close()

