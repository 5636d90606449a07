"""Stream-stream joins whose state the low watermark bounds: an interval join (each pair as soon
as both records are there) and a window join (each window's records of both sides at once, when
the watermark closes it). docs/operators/interval-join.md and window-join.md.

Both read two input streams keyed alike (``inputs={left: key_by(...), right: key_by(...)}``)
and tell their records apart by ``record.stream``. A record behind the watermark is late: the
engine's ``late`` option drops it (the default, counted in ``late_dropped``) or delivers it, to
match what is still held.
"""

from __future__ import annotations

from typing import Any

from ..errors import OptionError
from ..model import Context, Record, Timer
from .base import Operator, Window, held, record_of

__all__ = ["IntervalJoin", "WindowJoin"]

SELF_JOIN = "to join a stream with itself, key a copy of it into a stream of its own"


class IntervalJoin(Operator):
    """Joins each ``left`` record ``l`` with every ``right`` record ``r`` of the same key such that
    ``l.timestamp + lower_ms <= r.timestamp <= l.timestamp + upper(l)`` (``upper_ms``, unless
    ``upper`` is overridden to depend on the left record): ``join(ctx, l, r)`` runs once per pair,
    in the batch that brings the second of the two. A left record is kept until the watermark
    passes ``l.timestamp + upper(l)``, a right one until it passes ``r.timestamp - lower_ms``.

    >>> from headrace.operators import IntervalJoin
    >>> from headrace.testing import Harness
    >>> class ClickAfterView(IntervalJoin):
    ...     left, right = "views", "clicks"
    ...     lower_ms, upper_ms = 0, 1_000           # a click within a second after the view
    ...     def join(self, ctx, view, click):
    ...         ctx.produce("converted", {"ad": ctx.key, "view": view.timestamp, "click": click.timestamp})
    >>> h = Harness(ClickAfterView)
    >>> _ = h.process("ad-7", {}, 5_300, stream="clicks")    # the click first: it waits for its view
    >>> [r.value for r in h.process("ad-7", {}, 5_000, stream="views")]
    [{'ad': 'ad-7', 'view': 5000, 'click': 5300}]
    >>> _ = h.advance_watermark(6_001)                        # both are past their bounds: forgotten
    >>> h.state("ad-7") is None
    True
    """

    kind = "IntervalJoin"
    left: str = ""
    right: str = ""
    lower_ms: int = 0
    upper_ms: int = 0

    def join(self, ctx: Context, left: Record, right: Record) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def upper(self, left: Record) -> int:
        """The largest ``right.timestamp - left.timestamp`` that matches ``left``."""
        return self.upper_ms

    @classmethod
    def check(cls, name: str) -> None:
        cls.two_streams(name, "left", "right", ("views", "clicks"), SELF_JOIN)
        for bound in ("lower_ms", "upper_ms"):
            value = getattr(cls, bound)
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(f"{cls.kind} {name!r} needs {bound}, in milliseconds, an int", got=value,
                                  hint="e.g. lower_ms, upper_ms = 0, 60_000: a right record up to a minute after")
        if cls.upper is IntervalJoin.upper and cls.upper_ms < cls.lower_ms:
            raise OptionError(f"{cls.kind} {name!r} has upper_ms below lower_ms: nothing could match",
                              got=(cls.lower_ms, cls.upper_ms), hint="lower_ms <= upper_ms")
        cls.require_hook(name, "join", IntervalJoin, "define join(self, ctx, left, right): it runs once per matching pair")

    def process_record(self, ctx: Context, record: Record) -> None:
        side = self.side_of(ctx, record, {self.left: "l", self.right: "r"})
        state = ctx.state or {"l": [], "r": []}
        ts, lower, key = record.timestamp, self.lower_ms, ctx.key
        if side == "l":
            high = ts + self.upper(record)
            for kept in state["r"]:
                if ts + lower <= kept[0] <= high:
                    self.join(ctx, record, record_of(key, self.right, kept))
            state["l"].append((*held(record), high))
            self.wake_by(ctx, state, high + 1)
        else:
            for kept in state["l"]:
                if kept[0] + lower <= ts <= kept[3]:
                    self.join(ctx, record_of(key, self.left, kept[:3]), record)
            state["r"].append(held(record))
            self.wake_by(ctx, state, ts - lower + 1)
        ctx.state = state

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.state or {"l": [], "r": []}
        state.pop("t", None)  # it has fired
        self.evict(ctx, state, ctx.low_watermark)

    def evict(self, ctx: Context, state: dict[str, Any], watermark: int) -> None:
        """Forget what no future record can match (every future record is at or after the
        watermark), and keep the key's timer at the next such moment. It runs when the timer
        fires, once per batch that moved the watermark past something held, not per record."""
        lower = self.lower_ms
        state["l"] = [k for k in state["l"] if k[3] >= watermark]
        state["r"] = [k for k in state["r"] if k[0] - lower >= watermark]
        self.schedule(ctx, state, [*(k[3] + 1 for k in state["l"]), *(k[0] - lower + 1 for k in state["r"])])
        ctx.state = state if state["l"] or state["r"] else None


class WindowJoin(Operator):
    """Joins the ``left`` and ``right`` records of a key that fall in the same tumbling window of
    ``size_ms``: ``join_window(ctx, window, lefts, rights)`` runs once per key and window that
    got a record on either side, when the watermark reaches the window's end (an inner join
    produces only when both lists are non-empty). Each list is in (timestamp, id) order. State:
    the open windows' records, forgotten as each window is joined.

    >>> from headrace.operators import WindowJoin
    >>> from headrace.testing import Harness
    >>> class NewSellers(WindowJoin):
    ...     left, right, size_ms = "persons", "auctions", 10_000
    ...     def join_window(self, ctx, window, persons, auctions):
    ...         if persons and auctions:
    ...             ctx.produce("new_sellers", {"id": ctx.key, "start": window.start, "auctions": len(auctions)})
    >>> h = Harness(NewSellers)
    >>> _ = h.process("1001", {"name": "Ada"}, 2_000, stream="persons")
    >>> _ = h.process("1001", {"item": "lamp"}, 4_000, stream="auctions")
    >>> _ = h.process("1001", {"item": "rug"}, 9_999, stream="auctions")
    >>> [r.value for r in h.advance_watermark(10_000)]
    [{'id': '1001', 'start': 0, 'auctions': 2}]
    """

    kind = "WindowJoin"
    left: str = ""
    right: str = ""
    size_ms: int = 0

    def join_window(self, ctx: Context, window: Window, lefts: list[Record],
                    rights: list[Record]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def check(cls, name: str) -> None:
        cls.two_streams(name, "left", "right", ("persons", "auctions"), SELF_JOIN)
        cls.setting(name, "size_ms", example="10_000")
        cls.require_hook(name, "join_window", WindowJoin, "define join_window(self, ctx, window, lefts, rights): it "
                                                          "runs once per key and window, when the window closes")

    def process_record(self, ctx: Context, record: Record) -> None:
        side = self.side_of(ctx, record, {self.left: 0, self.right: 1})
        start = record.timestamp - record.timestamp % self.size_ms
        state = ctx.state or {}
        sides: tuple[list[Any], list[Any]] | None = state.get(start)
        if sides is None:
            sides = state[start] = ([], [])
            ctx.set_timer(f"w{start}", start + self.size_ms)
        sides[side].append(held(record))
        ctx.state = state

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.state or {}
        start = int(timer.tag[1:])
        sides = state.pop(start, None)
        ctx.state = state or None
        if sides is not None:
            key = ctx.key
            lefts = [record_of(key, self.left, k) for k in sorted(sides[0], key=lambda k: k[:2])]
            rights = [record_of(key, self.right, k) for k in sorted(sides[1], key=lambda k: k[:2])]
            self.join_window(ctx, Window(start, start + self.size_ms), lefts, rights)
