"""The test session's Python processes, started by Spark itself: task workers and a streaming
query's source process import pyspark from the installed package, not from Spark's zip
(spark/session.py's launcher; BENCHMARKS.md, "Monoid computations")."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import pyspark
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

INSTALLED = pyspark.__file__


class WhereIsPyspark(DataSource):
    """A streaming source whose offsets say where its process imported pyspark from."""

    @classmethod
    def name(cls) -> str:
        return "where_is_pyspark"

    def schema(self) -> str:
        return "file STRING"

    def streamReader(self, schema: Any) -> "WhereReader":
        return WhereReader()


class WhereReader(DataSourceStreamReader):
    def _offset(self) -> dict:
        import pyspark as imported

        return {"file": imported.__file__, "pid": os.getpid()}

    def initialOffset(self) -> dict:
        return self._offset()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        return self._offset()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return iter(())


def test_task_workers_import_the_installed_pyspark(spark: Any) -> None:
    def where(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyspark as imported

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [imported.__file__]})

    files = {r.file for r in spark.range(2).repartition(2).mapInArrow(where, "file STRING").collect()}
    assert files == {INSTALLED}


def test_a_streaming_querys_source_process_imports_the_installed_pyspark(spark: Any, tmp_path: Any) -> None:
    spark.dataSource.register(WhereIsPyspark)
    query = (spark.readStream.format("where_is_pyspark").load().writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    offsets = [p["sources"][0]["endOffset"] for p in query.recentProgress]
    assert offsets, "the query made no progress"
    seen = [json.loads(o) if isinstance(o, str) else o for o in offsets]
    assert {o["file"] for o in seen} == {INSTALLED}
    assert all(o["pid"] != os.getpid() for o in seen)  # the source ran in a process of its own
