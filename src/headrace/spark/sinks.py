"""Sinks (``Topology.sink``): one Spark streaming query per sink over the stream's DataFrame view
(``spark/frames.py``), started by either runner next to the computations.

Exactly once per committed stream batch: the view's offsets are journaled batch numbers, so a
micro-batch Spark replays after a crash (same batch id, same offsets, from the sink's checkpoint)
reads the same records. Spark's file sink then records each batch in its ``_spark_metadata`` log
once, and readers (``spark.read``) see only logged files; the JDBC sink first deletes the rows of
the (producer, batch) pairs it is about to write, so a batch written again replaces itself; the
Delta and Iceberg sinks skip the (producer, batch) pairs their table records (``lake_sinks.py``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import OptionError, UserCodeError
from ..sinkspec import SinkSpec, libpq_url
from ..topology import Topology
from .frames import stream_frame
from .kafka_sink import KafkaSink
from .checkpoints import clear_unfinished_writes
from .lake_sinks import LAKE_KINDS, LakeWrite
from .query import Restartable, failure_detail

__all__ = ["SinkQuery", "start_sinks", "spark_sinks", "jdbc_jars"]

# Debian's libpostgresql-jdbc-java puts the driver here.
POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"
POSTGRES_DRIVER = "org.postgresql.Driver"


def jdbc_jars(topology: Topology) -> dict[str, str]:
    """Spark configuration a topology's JDBC sinks need: the PostgreSQL driver on the classpath."""
    if not any(s.kind == "jdbc" for s in topology.sinks.values()):
        return {}
    if not os.path.exists(POSTGRES_JDBC_JAR):
        raise OptionError("A JDBC sink needs PostgreSQL's JDBC driver", got=POSTGRES_JDBC_JAR,
                          hint="apt-get install -y libpostgresql-jdbc-java, or pass spark= a session with the "
                               "driver in spark.jars")
    return {"spark.jars": POSTGRES_JDBC_JAR}


class SinkQuery(Restartable):
    """Starts, runs, drains and stops the streaming query of one sink."""

    def __init__(self, spark: Any, topology: Topology, spec: SinkSpec, url: str, checkpoint_root: str,
                 trigger_ms: int):
        self.spark, self.spec, self.url, self.trigger_ms = spark, spec, url, trigger_ms
        schema = topology.schemas.get(spec.stream)
        self.ddl = schema.ddl if schema else ""
        self.fields = list(schema.arrow.names) if schema else None
        self.checkpoint = os.path.join(checkpoint_root, f"sink-{spec.name}")
        self.query: Any = None
        self.lake: LakeWrite | None = None

    def start(self) -> "SinkQuery":
        df = stream_frame(self.spark, self.spec.stream, self.url, self.ddl, streaming=True)
        clear_unfinished_writes(self.checkpoint)
        writer = (df.writeStream.queryName(f"headrace-sink-{self.spec.name}")
                  .option("checkpointLocation", self.checkpoint)
                  .trigger(processingTime=f"{self.trigger_ms} milliseconds"))
        if self.spec.kind == "file":
            writer = writer.format(self.spec.format).option("path", self.spec.path)
        elif self.spec.kind == "jdbc":
            writer = writer.foreachBatch(JdbcWrite(self.spec, bool(self.ddl)))
        elif self.spec.kind in LAKE_KINDS:
            self.lake = LakeWrite(self.spec, self.url, self.fields)
            writer = writer.foreachBatch(self.lake)
        else:
            writer = writer.foreachBatch(self.spec.foreach_batch)
        self.query = writer.start()
        return self

    def flush(self) -> None:
        """Write everything journaled so far (the runner calls it once the topology has drained)."""
        self.query.processAllAvailable()

    def written(self) -> dict[str, int] | None:
        """Per producer, the last batch of the stream the sink has written (its last completed
        Spark batch's end offset), or None before its first: what retention may forget of it."""
        progress = self.query.lastProgress if self.query is not None else None
        if not progress or not progress.get("sources"):
            return None
        end = progress["sources"][0].get("endOffset")
        offsets = json.loads(end) if isinstance(end, str) else end
        return {str(p): int(b) for p, b in offsets.items()} if isinstance(offsets, dict) else None

    def check(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise UserCodeError(f"The sink {self.spec.name!r} of stream {self.spec.stream!r} failed",
                                got_text=failure_detail(self.query.exception()),
                                hint="fix the cause and run again: the sink resumes from its last committed batch")

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
        if self.lake is not None:
            self.lake.close()


class JdbcWrite:
    """``foreachBatch`` of a JDBC sink: replace the rows of the batch's (producer, batch) pairs."""

    def __init__(self, spec: SinkSpec, typed: bool):
        assert spec.jdbc is not None and spec.table is not None  # Topology.sink requires both of a JDBC sink
        self.spec, self.typed = spec, typed
        self.jdbc, self.table = spec.jdbc, spec.table

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("key", *(["value.*"] if self.typed else ["value"]), "timestamp", "id", "producer", "batch")
        rows.persist()
        try:
            pairs = [(r.producer, r.batch) for r in rows.select("producer", "batch").distinct().collect()]
            if pairs:
                self._delete(pairs)
                rows.write.jdbc(self.jdbc, self.table, mode="append",
                                properties={"driver": POSTGRES_DRIVER, **self.spec.properties})
        finally:
            rows.unpersist()

    def _delete(self, pairs: list[tuple[str, int]]) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(libpq_url(self.jdbc, self.spec.properties), autocommit=True) as conn:
            # the table Spark's writer made: it sends ``table`` as SQL text, so PostgreSQL folds an
            # unquoted mixed-case name to lower case; to_regclass reads the text the same way, and
            # regclass prints the table's name quoted wherever it must be
            found = conn.execute("SELECT to_regclass(%s)::text", (self.table,)).fetchone()
            if found and found[0] is not None:
                conn.execute(sql.SQL("DELETE FROM {} WHERE (producer, batch) IN (SELECT * FROM unnest(%s::text[], "
                                     "%s::bigint[]))").format(sql.SQL(found[0])),
                             ([p for p, _ in pairs], [b for _, b in pairs]))


def start_sinks(spark: Any, topology: Topology, url: str, checkpoint_root: str,
                trigger_ms: int) -> list[SinkQuery | KafkaSink]:
    """A Spark streaming query per file, JDBC or ``foreach_batch`` sink; a writer thread per Kafka sink."""
    return [KafkaSink(topology.name, spec, url).start() if spec.kind == "kafka"
            else SinkQuery(spark, topology, spec, url, checkpoint_root, trigger_ms).start()
            for spec in topology.sinks.values()]


def spark_sinks(topology: Topology) -> bool:
    """Whether any sink of ``topology`` is a Spark query (a Kafka sink is a thread of the driver)."""
    return any(s.kind != "kafka" for s in topology.sinks.values())
