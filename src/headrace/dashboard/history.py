"""The dashboard's plots over the last minutes, read from the store: each stage's low watermark
and its lag behind the injectors (from the journal, so in either mode and after a run), its
records/s and backlog (from the samples the running driver writes once a second).

Reads are incremental: each producer's journal is read on from the last batch already seen, so a
poll every second costs a few index seeks once the window is loaded.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Any

from ..engine.ports import BatchInfo
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..store import Store
from .graph import upstream_injectors

__all__ = ["History", "lowest", "lag_behind"]

POINT_MS = 500  # at most one plotted point per stage per half second: the last one
SOURCE_MARGIN_MS = 10 * 60_000  # the injectors' journals are read this much before the window, for the lag


def lowest(journals: list[list[BatchInfo]]) -> list[tuple[int, int]]:
    """(time, lowest output watermark over ``journals``) after each batch of any of them; a journal
    with no batch yet holds the lowest at the beginning of time. Each journal is in batch order."""
    marks = [BEGINNING_OF_TIME] * len(journals)
    out: list[tuple[int, int]] = []
    merged = heapq.merge(*([(b.completed_at, i, b.output_watermark) for b in j] for i, j in enumerate(journals)))
    for at, i, mark in merged:
        marks[i] = max(marks[i], mark)
        out.append((at, min(marks)))
    return out


def lag_behind(source: list[tuple[int, int]], points: list[tuple[int, int]]) -> list[int]:
    """For each (time, low watermark) of a stage: how long it has been behind ``source`` (a
    ``lowest`` series) then, in ms: since the source's watermark first passed it, or 0 if it has not."""
    marks = [mark for _, mark in source]
    lags = []
    for at, watermark in points:
        i = bisect.bisect_right(marks, watermark)
        lags.append(0 if watermark >= END_OF_TIME or i == len(source) else max(0, at - source[i][0]))
    return lags


def _shown(mark: int) -> int | None:
    return mark if BEGINNING_OF_TIME < mark < END_OF_TIME else None


class History:
    """Series per stage over the last ``window_ms``; one per dashboard, reused across polls."""

    def __init__(self, store: Store, window_ms: int = 5 * 60_000):
        self.store, self.window_ms = store, window_ms
        self._journals: dict[str, list[BatchInfo]] = {}
        self._since: dict[str, int] = {}  # per topology: where its last window began

    def end_of_window(self, graph: dict[str, Any], now_ms: int) -> int:
        """``now_ms``, or for a topology that journaled nothing in the last window (a run that has
        ended) the moment just after its last batch: the plots show its last minutes, not nothing."""
        producers = [p for i in graph["injectors"].values() for p in i["parts"]] + list(graph["computations"])
        last = max((b.completed_at for b in map(self.store.latest_batch, producers) if b is not None), default=None)
        return last + POINT_MS if last is not None and last + POINT_MS < now_ms - self.window_ms else now_ms

    def _journal(self, producer: str, since_ms: int) -> list[BatchInfo]:
        """``producer``'s batches completed since ``since_ms``, and the one before (where it stood then)."""
        known = self._journals.get(producer)
        if known is None:
            known = self.store.batches(producer, max(0, self.store.batch_before(producer, since_ms) - 1))
        else:
            known += self.store.batches(producer, known[-1].batch if known else 0)
        first = max(0, bisect.bisect_left([b.completed_at for b in known], since_ms) - 1)
        self._journals[producer] = known = known[first:]
        return known

    def series(self, graph: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """For one recorded topology graph: ``watermarks``, per stage, times and low watermarks (None
        at the beginning or end of time), and times and lags behind its injectors in ms (the same
        times, and now); ``throughput``, per stage, times, records/s and backlog. The window ends at
        ``end_of_window``; ``until_ms`` says where."""
        now_ms = self.end_of_window(graph, now_ms)
        since = now_ms - self.window_ms
        if since < self._since.get(graph["name"], since):  # the window went back: read its journals again
            self._journals.clear()
        self._since[graph["name"]] = since
        parts = {p: self._journal(p, since - SOURCE_MARGIN_MS) for i in graph["injectors"].values() for p in i["parts"]}
        stages = {name: lowest([parts[p] for p in injector["parts"]]) for name, injector in graph["injectors"].items()}
        sources = {name: lowest([parts[p] for i in injectors for p in graph["injectors"][i]["parts"]])
                   for name, injectors in upstream_injectors(graph).items()}
        stages.update({name: [(b.completed_at, b.output_watermark) for b in self._journal(name, since)]
                       for name in graph["computations"]})
        marks = {}
        for name, points in stages.items():
            kept = list({at // POINT_MS: (at, mark) for at, mark in points if at >= since}.values())
            # the lag goes on growing while the watermark stands still: a last lag point at now shows it
            lagging = kept + [(now_ms, kept[-1][1])] if kept and kept[-1][0] < now_ms else kept
            marks[name] = {"t": [at for at, _ in kept], "watermark": [_shown(mark) for _, mark in kept],
                           "lag_t": [at for at, _ in lagging], "lag_ms": lag_behind(sources.get(name, []), lagging)}
        return {"window_ms": self.window_ms, "until_ms": now_ms, "watermarks": marks,
                "throughput": self._rates(set(stages), since)}

    def _rates(self, stages: set[str], since_ms: int) -> dict[str, Any]:
        """Per stage: records/s between successive samples, and the backlog at each."""
        out: dict[str, Any] = {}
        previous: dict[str, Any] = {}
        for sample in self.store.samples(since_ms):
            if sample.name not in stages:
                continue
            series = out.setdefault(sample.name, {"t": [], "records_per_s": [], "backlog": []})
            last, previous[sample.name] = previous.get(sample.name), sample
            if last is not None and sample.at > last.at:
                series["t"].append(sample.at)
                series["records_per_s"].append(round((sample.records - last.records) * 1000 / (sample.at - last.at), 1))
                series["backlog"].append(sample.backlog)
        return out
