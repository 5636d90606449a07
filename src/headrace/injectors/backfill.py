"""Backfill: one stream fed first by history, then by a live source, with no restart, gap or
duplicate at the switch (the Facebook paper's backfill, §4.5: the same application over
historical data, then on with the live stream).

The switch is a time, ``switch_at``: history contributes its records before it, the live source
its records from it on. So the two may overlap (a log that is still being archived, a generator
that starts early) and each record is still injected once. While history is read, the low
watermark follows its event time (the highest timestamp read so far, less ``max_delay_ms``, the
disorder the history may have); when history ends it is ``switch_at`` (every record to come is
live, so at or after it), and the live source's own watermark takes over from there, never
below ``switch_at``.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from ..errors import OptionError
from ..model import END_OF_TIME, to_millis
from . import InjectedBatch, Injector, RecordsInjector

__all__ = ["Backfill", "backfill"]


class Backfill(Injector):
    def __init__(self, history: Injector, live: Injector, switch_at: int, max_delay_ms: int = 0):
        for role, part in (("history", history), ("live", live)):
            if not isinstance(part, Injector):
                raise OptionError(f"backfill()'s {role} must be an injector (or, for history, a Spark batch "
                                  "DataFrame)", got=part,
                                  hint="e.g. backfill(injectors.files('/archive', timestamp='ts', bounded=True), "
                                       "injectors.generator(make, timestamp='ts'), switch_at=...)")
        if not history.bounded:
            raise OptionError("backfill()'s history must be bounded: the live source takes over once it ends",
                              got=history, hint="e.g. injectors.files(path, timestamp='ts', bounded=True)")
        if isinstance(max_delay_ms, bool) or not isinstance(max_delay_ms, int) or max_delay_ms < 0:
            raise OptionError("backfill()'s max_delay_ms must be an integer >= 0", got=max_delay_ms,
                              hint="the most a history record may lag the highest timestamp before it, e.g. 1000")
        self.history, self.live = history, live
        self.switch_at = to_millis(switch_at, "switch_at")
        self.max_delay_ms = max_delay_ms
        self.bounded = live.bounded

    def batches(self, resume: str | None) -> Iterator[InjectedBatch]:
        phase, inner = ("history", None) if resume is None else tuple(json.loads(resume))
        if phase == "history":
            high = None
            for batch in self.history.batches(inner):
                kept = [r for r in batch.records if r[1] < self.switch_at]
                for _, ts, _ in kept:
                    high = ts if high is None or ts > high else high
                mark = min(self.switch_at, (high - self.max_delay_ms) if high is not None else batch.watermark)
                done = batch.watermark == END_OF_TIME
                yield InjectedBatch(kept, self.switch_at if done else mark,
                                    json.dumps(["live", None] if done else ["history", batch.checkpoint]))
                if done:
                    break
            inner = None
        for batch in self.live.batches(inner):
            yield InjectedBatch([r for r in batch.records if r[1] >= self.switch_at],
                                max(batch.watermark, self.switch_at), json.dumps(["live", batch.checkpoint]))


def backfill(history: Any, live: Injector, *, switch_at: Any, timestamp: Any = None, max_delay_ms: int = 0,
             batch_size: int = 10_000) -> Backfill:
    """Inject ``history`` (a bounded injector, or a Spark batch DataFrame such as a Parquet table,
    read with ``timestamp``) up to ``switch_at``, then ``live`` from ``switch_at`` on, as one stream."""
    if hasattr(history, "toLocalIterator") and hasattr(history, "isStreaming"):
        if history.isStreaming:
            raise OptionError("backfill()'s history must be a batch DataFrame, not a streaming one", got=history,
                              hint="spark.read...(), not spark.readStream...()")
        frame = history
        history = RecordsInjector(lambda: (row.asDict(recursive=True) for row in frame.toLocalIterator()),
                                  timestamp, batch_size=batch_size, bounded=True)
    return Backfill(history, live, switch_at, max_delay_ms)
