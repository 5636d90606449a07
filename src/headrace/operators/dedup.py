"""Deduplication by key within a time bound. docs/operators/dedup.md."""

from __future__ import annotations

from typing import Any

from ..model import Context, Record, Timer
from .base import Operator, held, record_of

__all__ = ["Deduplicate"]


class Deduplicate(Operator):
    """Passes on the first record of each key and drops the ones that follow it closely: taken in
    (timestamp, id) order, a record is a duplicate when the key's previous record is at most
    ``within_ms`` older. ``emit(ctx, record)`` runs for each record that is not. The order is
    event time, not arrival, so the outcome does not depend on how the input interleaves: each
    record is judged once the watermark has passed its timestamp. Duplicates are counted in the
    counter ``duplicates_dropped``.

    State per key: the records waiting for the watermark, and the timestamp of the key's last
    record until the watermark is ``within_ms`` past it.

    >>> from headrace.operators import Deduplicate
    >>> from headrace.testing import Harness
    >>> class OncePerMinute(Deduplicate):
    ...     within_ms = 60_000
    ...     def emit(self, ctx, record):
    ...         ctx.produce("alerts", record.value)
    >>> h = Harness(OncePerMinute)
    >>> for ts in (30_000, 0, 70_000, 200_000):              # out of order is fine
    ...     _ = h.process("disk-full", {"at": ts}, ts)
    >>> [r.value["at"] for r in h.advance_watermark(300_000)]  # 30 s after 0, 40 s after 30 s: dropped
    [0, 200000]
    >>> h.counters["duplicates_dropped"]
    2
    """

    kind = "Deduplicate"
    within_ms: int = 0

    def emit(self, ctx: Context, record: Record) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def check(cls, name: str) -> None:
        cls.setting(name, "within_ms", lowest=0, example="60_000")
        cls.require_hook(name, "emit", Deduplicate, "define emit(self, ctx, record): it runs for each record that is "
                                                    "not a duplicate")

    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state or {"waiting": [], "last": None}
        state["waiting"].append((*held(record), record.stream))
        self.wake_by(ctx, state, record.timestamp + 1)
        ctx.state = state

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.state or {"waiting": [], "last": None}
        state.pop("t", None)  # it has fired
        self.settle(ctx, state, ctx.low_watermark)

    def settle(self, ctx: Context, state: dict[str, Any], watermark: int) -> None:
        due = sorted(k for k in state["waiting"] if k[0] < watermark)
        if due:
            state["waiting"] = [k for k in state["waiting"] if k[0] >= watermark]
            last, within = state["last"], self.within_ms
            for kept in due:
                if last is not None and kept[0] - last <= within:
                    ctx.count("duplicates_dropped")
                else:
                    self.emit(ctx, record_of(ctx.key, kept[3], kept[:3]))
                last = kept[0]
            state["last"] = last
        if state["last"] is not None and state["last"] + self.within_ms < watermark:
            state["last"] = None  # every record still to come is more than within_ms after it
        self.schedule(ctx, state, [*(k[0] + 1 for k in state["waiting"]),
                                   *([state["last"] + self.within_ms + 1] if state["last"] is not None else [])])
        ctx.state = state if state["waiting"] or state["last"] is not None else None
