"""The SparkSession headrace runs on, configured for one task per key shard."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["spark_session", "ui_url"]


def spark_session(master: str = "local[*]", app_name: str = "headrace", conf: dict[str, str] | None = None,
                  ui: bool = True) -> Any:
    """Get (or create) the session; registers the ``headrace`` streaming source. ``ui=False``
    turns Spark's web UI off (it is on by default; ``ui_url(spark)`` says where).

    Python workers run ``PYSPARK_PYTHON``; it defaults to this interpreter so they find headrace.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .source import HeadraceSource

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.ui.enabled", "true" if ui else "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.python.worker.reuse", "true")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "false"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HeadraceSource)
    return spark


def ui_url(spark: Any) -> str | None:
    """Where the session's Spark web UI listens (``None`` when it is off)."""
    return spark.sparkContext.uiWebUrl
