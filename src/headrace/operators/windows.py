"""Windows in event time: tumbling, sliding and session windows of any fold (``zero``, ``lift``,
``combine``, as a ``MonoidComputation`` has), with an allowed lateness and an explicit policy for
records too late to use. docs/operators/tumbling.md, sliding.md and session.md say what each
emits, when, and what it keeps.

A window ``[start, end)`` is emitted by ``emit(ctx, window, aggregate)`` once the low watermark
reaches ``end``, stamped ``end``. With ``allowed_lateness_ms = L`` it is kept until the watermark
reaches ``end + L``: a record behind the watermark that still falls in it is folded in and the
window is emitted again, with its whole aggregate, in the same batch (stamped with the watermark
then; consumers keep the last emission of a window). A record that no window it belongs to can
take any more is too late: counted in the counter ``too_late``, or, with ``late_stream`` set,
produced there as it came. With no lateness and no late stream the engine drops every record
behind the watermark itself and counts it in ``late_dropped`` (docs/architecture.md §2.6).
"""

from __future__ import annotations

from typing import Any

from ..errors import OptionError
from ..model import Context, Record, Timer
from .base import Operator, Window

__all__ = ["TumblingWindow", "SlidingWindow", "SessionWindow"]


class _Windowed(Operator):
    """What every window operator shares: the fold hooks, the lateness settings and the policy."""

    allowed_lateness_ms: int = 0
    late_stream: str | None = None

    def zero(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def lift(self, record: Record) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def combine(self, a: Any, b: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def emit(self, ctx: Context, window: Window, aggregate: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def check(cls, name: str) -> None:
        missing = [h for h in ("zero", "lift", "combine", "emit") if getattr(cls, h) is getattr(_Windowed, h)]
        if missing:
                raise OptionError(f"{cls.kind} {name!r} does not define {', '.join(missing)}", got=cls,
                              hint="a window folds its records with zero(), lift(record) and combine(a, b) "
                                   "and produces in emit(ctx, window, aggregate); headrace.monoids has "
                                   "ready-made lift hooks (constant(1), field('n'))")
        cls.setting(name, "allowed_lateness_ms", lowest=0, example="5_000")
        if cls.late_stream is not None:
            cls.stream_setting(name, "late_stream", "late_bids")

    @classmethod
    def needs_late_records(cls) -> bool:
        return bool(cls.allowed_lateness_ms) or cls.late_stream is not None

    def too_late(self, ctx: Context, record: Record) -> None:
        if self.late_stream is None:
            ctx.count("too_late")
        else:
            ctx.produce(self.late_stream, record.value)

    # Every window's slot is [end, aggregate, emitted, updated] under its start; its timer
    # w<start> (s<start> for a session) is due at its end, then at its end plus the lateness, and
    # u<start> at once when a late record updated an emitted window.
    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.state or {}
        start = int(timer.tag[1:])
        slot = state.get(start)
        if slot is None:
            return
        end, aggregate, emitted, updated = slot
        if timer.tag[0] == "u":
            if updated:
                slot[3] = False
                self.emit(ctx, Window(start, end), aggregate)
        elif not emitted:
            self.emit(ctx, Window(start, end), aggregate)
            if self.allowed_lateness_ms:
                slot[2] = True
                ctx.set_timer(timer.tag, end + self.allowed_lateness_ms)
            else:
                del state[start]
        else:
            del state[start]
        ctx.state = state or None


class _Aligned(_Windowed):
    """Windows at fixed places in time (tumbling and sliding). State: ``{start: [end, aggregate,
    emitted, updated]}``; a timer ``w<start>`` at the window's end (then at its end plus the
    lateness, to forget it), and ``u<start>`` due at once when a late record updated it."""

    def windows_of(self, timestamp: int) -> list[Window]:  # pragma: no cover - overridden
        raise NotImplementedError

    def process_record(self, ctx: Context, record: Record) -> None:
        lateness, watermark = self.allowed_lateness_ms, ctx.low_watermark
        state = ctx.state or {}
        part: Any = None
        used = False
        for window in self.windows_of(record.timestamp):
            if window.end + lateness <= watermark:
                continue  # forgotten already: too late for this one
            if not used:
                part, used = self.lift(record), True
            slot = state.get(window.start)
            if slot is None:
                state[window.start] = [window.end, self.combine(self.zero(), part), False, False]
                ctx.set_timer(f"w{window.start}", window.end)
                continue
            slot[1] = self.combine(slot[1], part)
            if slot[2] and not slot[3]:  # emitted already: emit it again, once per batch
                slot[3] = True
                ctx.set_timer(f"u{window.start}", watermark)
        if not used:
            self.too_late(ctx, record)
        ctx.state = state or None


class TumblingWindow(_Aligned):
    """Back-to-back windows of ``size_ms``: a record at ``ts`` is in ``[ts - ts % size_ms, ... +
    size_ms)``. Set ``size_ms``; define ``zero``, ``lift``, ``combine`` and ``emit``.

    >>> from headrace.operators import TumblingWindow
    >>> from headrace.testing import Harness
    >>> class Clicks(TumblingWindow):
    ...     size_ms = 1_000
    ...     def zero(self): return 0
    ...     def lift(self, record): return 1
    ...     def combine(self, a, b): return a + b
    ...     def emit(self, ctx, window, count):
    ...         ctx.produce("clicks", {"page": ctx.key, "start": window.start, "count": count})
    >>> h = Harness(Clicks)
    >>> for ts in (100, 900, 1_200):
    ...     _ = h.process("/home", {}, ts)
    >>> [(r.value, r.timestamp) for r in h.advance_watermark(1_000)]
    [({'page': '/home', 'start': 0, 'count': 2}, 1000)]
    """

    kind = "TumblingWindow"
    size_ms: int = 0

    @classmethod
    def check(cls, name: str) -> None:
        super().check(name)
        cls.setting(name, "size_ms", example="60_000")

    def windows_of(self, timestamp: int) -> list[Window]:
        start = timestamp - timestamp % self.size_ms
        return [Window(start, start + self.size_ms)]


class SlidingWindow(_Aligned):
    """Windows of ``size_ms`` starting every ``slide_ms`` (at multiples of it): a record is in
    every window ``[s, s + size_ms)`` with ``s <= ts``, so in ``size_ms / slide_ms`` of them."""

    kind = "SlidingWindow"
    size_ms: int = 0
    slide_ms: int = 0

    @classmethod
    def check(cls, name: str) -> None:
        super().check(name)
        cls.setting(name, "size_ms", example="10_000")
        cls.setting(name, "slide_ms", example="2_000")

    def windows_of(self, timestamp: int) -> list[Window]:
        size, slide = self.size_ms, self.slide_ms
        start = timestamp - timestamp % slide
        windows = []
        while start + size > timestamp:
            windows.append(Window(start, start + size))
            start -= slide
        return windows


class SessionWindow(_Windowed):
    """Per key, records less than ``gap_ms`` apart in event time form one session: a record at
    ``ts`` opens ``[ts, ts + gap_ms)`` and every session it overlaps merges with it. A session is
    emitted once the watermark reaches its end (its last record plus the gap). ``combine`` joins
    two sessions' aggregates, the earlier first.

    State: ``{start: [end, aggregate, emitted, updated]}`` of the key's open sessions; a timer
    ``s<start>`` at each one's end (then its end plus the lateness), ``u<start>`` for an update."""

    kind = "SessionWindow"
    gap_ms: int = 0

    @classmethod
    def check(cls, name: str) -> None:
        super().check(name)
        cls.setting(name, "gap_ms", example="30_000")

    def process_record(self, ctx: Context, record: Record) -> None:
        ts, gap, lateness, watermark = record.timestamp, self.gap_ms, self.allowed_lateness_ms, ctx.low_watermark
        state = ctx.state or {}
        touched = sorted(s for s, slot in state.items() if s < ts + gap and ts < slot[0])
        if not touched and ts + gap + lateness <= watermark:
            self.too_late(ctx, record)
            return
        parts = [(s, *state.pop(s)) for s in touched]
        for s, *_ in parts:
            ctx.delete_timer(f"s{s}")
            ctx.delete_timer(f"u{s}")
        aggregate, mine, placed = self.zero(), self.lift(record), False
        for s, _, a, *_ in parts:  # in the order of their starts, the record's part in its place
            if not placed and ts < s:
                aggregate, placed = self.combine(aggregate, mine), True
            aggregate = self.combine(aggregate, a)
        if not placed:
            aggregate = self.combine(aggregate, mine)
        start = min([ts, *(p[0] for p in parts)])
        end = max([ts + gap, *(p[1] for p in parts)])
        complete = end <= watermark
        state[start] = [end, aggregate, complete, complete]
        ctx.set_timer(f"s{start}", end + lateness if complete else end)
        if complete:
            ctx.set_timer(f"u{start}", watermark)
        ctx.state = state
