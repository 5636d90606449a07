"""Delta Lake and Iceberg sinks without the JVM (``deltalake``, ``pyiceberg``): what a sink's
batch writes, exactly once per (producer, batch) of the stream, fenced against zombie writers.

A sink batch is Arrow rows with ``producer`` and ``batch`` columns, whole journaled batches of
each producer (the stream's DataFrame view reads a producer's batches in (start, end]). A write:

1. checks the sink's sequencer in the store (``acquire_sink_writer`` at the writer's start): a
   writer a newer one superseded raises ``FencedWriterError`` before it reads the table;
2. reads, from the table's current snapshot, the last batch written per producer (Delta: an
   application transaction per producer; Iceberg: a snapshot summary property) and drops the
   rows of batches already there, so a retried batch writes nothing again;
3. commits the rest with the new last batches, *against that snapshot*: a writer that committed
   the same producers' batches in between makes the commit fail (Delta's conflict check on the
   application transactions; the SQL catalog's compare-and-set of the table's metadata, with
   pyiceberg's retries turned off for the table), and the failure is a ``FencedWriterError``.

Step 1 stops a zombie early; step 3 closes the window between the check and the commit.
"""

from __future__ import annotations

from ..errors import OptionError
from ..store import Store
from .base import LakeSink, batches_of

__all__ = ["LakeSink", "batches_of", "open_lake_sink"]


def open_lake_sink(kind: str, name: str, store_url: str, target: str, warehouse: str | None = None,
                   store: Store | None = None) -> LakeSink:
    """The writer of a ``delta=`` or ``iceberg=`` sink."""
    extra = {"delta": "deltalake", "iceberg": "pyiceberg"}.get(kind)
    try:
        if kind == "delta":
            from .delta import DeltaSink
            return DeltaSink(name, store_url, target, store=store)
        if kind == "iceberg":
            from .iceberg import IcebergSink
            return IcebergSink(name, store_url, target, warehouse or "", store=store)
    except ImportError as exc:
        raise OptionError(f"The {kind} sink {name!r} needs the {extra} package", got_text=str(exc),
                          hint=f"pip install 'headrace[{kind}]'") from exc
    raise OptionError("A lakehouse sink is a Delta or an Iceberg table", got=kind,
                      hint="delta='path/to/table' or iceberg='namespace.table', warehouse='path'")
