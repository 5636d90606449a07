"""A Spark streaming DataFrame as an injector: each micro-batch is published as one injector batch.

The watermark policy is declared: ``timestamp`` names the event-time column, ``max_delay_ms``
is how far behind the newest record a record may still arrive. Publishing is keyed by Spark's
batch id, so a batch Spark replays after a crash is not published twice.
"""

from __future__ import annotations

import os
import threading
from typing import Any, cast

from ..engine.publish import publish_injected
from ..engine.routing import RoutingPlan
from ..errors import OptionError
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..store import open_store
from ..schema import StreamSchema
from ..topology import Injection
from .checkpoints import clear_unfinished_writes

__all__ = ["DataFrameInjector", "is_streaming_dataframe"]

_TS = "__headrace_ts"


def is_streaming_dataframe(source: Any) -> bool:
    return getattr(source, "isStreaming", False) is True


class DataFrameInjector:
    def __init__(self, injection: Injection, producer: str, url: str, checkpoint_root: str, trigger_ms: int,
                 schema: StreamSchema | None, plan: RoutingPlan):
        self.stream, self.df, self.producer, self.url = injection.stream, injection.source, producer, url
        self.schema, self.plan = schema, plan
        self._since: int | None = None
        self._plan: RoutingPlan | None = None
        options = injection.options  # checked by Topology.inject
        self.ts_column = options.timestamp
        self.id_column = options.id
        self.max_delay_ms = options.max_delay_ms
        self.bounded = options.bounded
        self.checkpoint = os.path.join(checkpoint_root, f"inject-{self.stream}")
        self.trigger_ms = trigger_ms
        self.finished = threading.Event()
        self.watermark = BEGINNING_OF_TIME
        self.published = 0
        self.query: Any = None
        self._high: int | None = None

    def start(self) -> None:
        from pyspark.sql import functions as F

        store = open_store(self.url)
        last = store.latest_batch(self.producer)
        saved = store.checkpoint(self.producer)
        store.close()
        if last is not None and last.output_watermark == END_OF_TIME:
            self.watermark = END_OF_TIME
            self.finished.set()
            return
        self._high = int(saved) if saved else None
        column = cast(str, self.ts_column)  # a streaming DataFrame's injection requires one (InjectOptions)
        ts = F.col(column)
        kind = dict(self.df.dtypes)[column]
        stamped = self.df.withColumn(_TS, F.unix_millis(ts) if kind.startswith("timestamp") else ts.cast("long"))
        clear_unfinished_writes(self.checkpoint)
        writer = stamped.writeStream.foreachBatch(self._publish).option("checkpointLocation", self.checkpoint)
        writer = writer.trigger(availableNow=True) if self.bounded else \
            writer.trigger(processingTime=f"{self.trigger_ms} milliseconds")
        self.query = writer.queryName(f"headrace-inject-{self.stream}").start()
        if self.bounded:
            threading.Thread(target=self._finish_when_done, daemon=True, name=f"headrace-{self.producer}-end").start()

    def _publish(self, df: Any, batch_id: int) -> None:
        rows = [r.asDict(recursive=True) for r in df.collect()]
        records: list[tuple[Any, int, str | None]] = []
        for row in rows:
            ts = row.pop(_TS)
            if ts is None:
                raise OptionError(f"Stream {self.stream!r} got a row with no {self.ts_column!r}", got=row,
                                  hint="filter such rows out of the DataFrame, or fill the column")
            self._high = ts if self._high is None or ts > self._high else self._high
            records.append((row, ts, str(row[self.id_column]) if self.id_column else None))
        watermark = BEGINNING_OF_TIME if self._high is None else self._high - self.max_delay_ms
        store = open_store(self.url)
        try:
            if self._since is None or self._plan is not self.plan:  # the first batch, or a new plan (a rescale)
                self._since, self._plan = batch_id + 1, self.plan
                if self.plan.subscribers:
                    store.register_plan(self.plan.id, self.plan.routes)
            self.published += publish_injected(store, self.producer, batch_id + 1, self.stream, records, watermark,
                                               None if self._high is None else str(self._high), self.schema,
                                               self.plan, self._since)
        finally:
            store.close()
        self.watermark = max(self.watermark, watermark)

    def _finish_when_done(self) -> None:
        self.query.awaitTermination()
        if self.query.exception() is not None:
            return
        store = open_store(self.url)
        try:
            last = store.latest_batch(self.producer)
            store.publish(self.producer, (last.batch if last else 0) + 1, {}, END_OF_TIME, str(self._high))  # no records
        finally:
            store.close()
        self.watermark = END_OF_TIME
        self.finished.set()

    def check(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise OptionError(f"The streaming DataFrame injected as {self.stream!r} failed",
                              got_text=str(self.query.exception()).splitlines()[0],
                              hint="fix the source; it resumes from its Spark checkpoint")

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()
