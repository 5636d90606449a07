"""Filterer, Joiner, Scorer and Ranker: the trending-events pipeline of the Facebook paper."""

from __future__ import annotations

import bisect
from typing import Any

from headrace import Computation

from .events import DIMENSIONS

WINDOW_MS = 300_000  # the Ranker's five-minute windows
SHORT_MS = 60_000  # short-term counter: the last minute of a window
LONG_MS = 600_000  # long-term counter: the last ten minutes
TOP_K = 3
KEPT_TYPES = {"post", "share"}


class Filterer(Computation):
    """Keeps the event types the application ranks."""

    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value["type"] in KEPT_TYPES:
            ctx.produce("filtered", record.value)


class Joiner(Computation):
    """Looks up the dimension table (a module constant, shipped with the code to every worker);
    drops events without an English topic."""

    def process_record(self, ctx: Any, record: Any) -> None:
        topic, language = DIMENSIONS.get(record.value["dim"], (None, None))
        if topic is not None and language == "en":
            ctx.produce("joined", {"event": record.value["event"], "topic": topic})


def window_end(ts: int) -> int:
    return ts - ts % WINDOW_MS + WINDOW_MS


class Scorer(Computation):
    """Per (topic, event): at every window end, a short-term and a long-term count of what came
    before it; the score is ``10 * short + long``. Watermark timers make it complete."""

    def process_record(self, ctx: Any, record: Any) -> None:
        stamps = ctx.state or []
        bisect.insort(stamps, record.timestamp)
        ctx.state = stamps
        ctx.set_timer(f"window-{window_end(record.timestamp)}", window_end(record.timestamp))

    def process_timer(self, ctx: Any, timer: Any) -> None:
        stamps = ctx.state
        end = timer.timestamp
        short = bisect.bisect_left(stamps, end) - bisect.bisect_left(stamps, end - SHORT_MS)
        long = bisect.bisect_left(stamps, end) - bisect.bisect_left(stamps, end - LONG_MS)
        topic, event = ctx.key.split("|", 1)
        if long:
            ctx.produce("scores", {"topic": topic, "event": event, "window": end - WINDOW_MS,
                                   "score": 10 * short + long})
        following = end + WINDOW_MS
        stamps = stamps[bisect.bisect_left(stamps, following - LONG_MS):]
        ctx.state = stamps or None
        if stamps and stamps[0] < following:  # what is here still counts at the next window's end
            ctx.set_timer(f"window-{following}", following)


class Ranker(Computation):
    """Per topic: the top K events of each five-minute window, once the window is complete."""

    def process_record(self, ctx: Any, record: Any) -> None:
        v = record.value
        windows = ctx.state or {}
        windows.setdefault(v["window"], {})[v["event"]] = v["score"]
        ctx.state = windows
        ctx.set_timer(f"rank-{v['window']}", record.timestamp + 1)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        windows = ctx.state
        window = int(timer.tag.split("-", 1)[1])
        scores = windows.pop(window)
        top = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:TOP_K]
        ctx.produce("trending", {"topic": ctx.key, "window": window, "top": [list(t) for t in top]})
        ctx.state = windows or None


def oracle(events: list[dict[str, Any]]) -> dict[tuple[str, int], list[list[Any]]]:
    """The same application in plain Python: (topic, window start) -> top K [event, score]."""
    stamps: dict[tuple[str, str], list[int]] = {}
    for e in events:
        topic, language = DIMENSIONS.get(e["dim"], (None, None))
        if e["type"] in KEPT_TYPES and topic is not None and language == "en":
            stamps.setdefault((topic, e["event"]), []).append(e["ts"])
    scores: dict[tuple[str, int], dict[str, int]] = {}
    for (topic, event), ts in stamps.items():
        ends = {window_end(t) + k * WINDOW_MS for t in ts for k in range(LONG_MS // WINDOW_MS)}
        for end in ends:
            short = sum(end - SHORT_MS <= t < end for t in ts)
            long = sum(end - LONG_MS <= t < end for t in ts)
            if long:
                scores.setdefault((topic, end - WINDOW_MS), {})[event] = 10 * short + long
    return {k: [list(t) for t in sorted(v.items(), key=lambda item: (-item[1], item[0]))[:TOP_K]]
            for k, v in scores.items()}
