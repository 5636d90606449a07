"""A lookup (enrichment) join against a table stream: each record of ``stream`` is joined with the
latest value of its key in ``table`` as of the record's own time. docs/operators/lookup-join.md.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from ..model import Context, Record, Timer
from .base import Operator, held, record_of

__all__ = ["LookupJoin"]


class LookupJoin(Operator):
    """``table`` is a stream of rows, the latest per key being the table (a row whose value is
    ``None`` deletes the key); each record of ``stream`` is looked up in it as of its timestamp:
    ``join(ctx, record, row)`` gets the value of the key's row with the largest timestamp at or
    before the record's (the larger id on a tie), or ``None`` when there is none. The lookup runs
    once the watermark has passed the record's timestamp, when no earlier row can still come, so
    the answer is the same however the two streams interleave (an as-of join).

    State per key: the records waiting for the watermark, the newest row at or behind it and any
    rows ahead of it. ``ttl_ms`` (optional) forgets a row that long after its timestamp: a record
    later than that finds ``None``, and a key with no row and nothing waiting keeps no state.

    >>> from headrace.operators import LookupJoin
    >>> from headrace.testing import Harness
    >>> class Enrich(LookupJoin):
    ...     table, stream = "users", "clicks"
    ...     def join(self, ctx, click, user):
    ...         ctx.produce("enriched", {"user": ctx.key, "page": click.value["page"],
    ...                                  "country": user["country"] if user else None})
    >>> h = Harness(Enrich)
    >>> _ = h.process("u1", {"country": "NZ"}, 1_000, stream="users")
    >>> _ = h.process("u1", {"page": "/a"}, 1_500, stream="clicks")
    >>> _ = h.process("u1", {"country": "FR"}, 2_000, stream="users")   # moved: later clicks see FR
    >>> _ = h.process("u1", {"page": "/b"}, 2_500, stream="clicks")
    >>> [r.value["country"] for r in h.advance_watermark(3_000)]
    ['NZ', 'FR']
    """

    kind = "LookupJoin"
    table: str = ""
    stream: str = ""
    ttl_ms: int | None = None

    def join(self, ctx: Context, record: Record, row: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def check(cls, name: str) -> None:
        cls.two_streams(name, "table", "stream", ("users", "clicks"),
                        "table names the stream of rows, stream the records to enrich")
        cls.setting(name, "ttl_ms", optional=True, example="86_400_000")
        cls.require_hook(name, "join", LookupJoin, "define join(self, ctx, record, row): row is None when the key has none")

    def process_record(self, ctx: Context, record: Record) -> None:
        side = self.side_of(ctx, record, {self.table: "rows", self.stream: "waiting"})
        state = ctx.state or {"rows": [], "waiting": []}
        state[side].append(held(record))
        rows = state["rows"]
        if side == "rows" and len(rows) > 1 and rows[-2][:2] > rows[-1][:2]:
            rows.sort(key=lambda k: k[:2])
        self.wake_by(ctx, state, record.timestamp + 1)  # a record's lookup, or the rows a row makes old
        ctx.state = state

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        state = ctx.state or {"rows": [], "waiting": []}
        state.pop("t", None)  # it has fired
        self.settle(ctx, state, ctx.low_watermark)

    def settle(self, ctx: Context, state: dict[str, Any], watermark: int) -> None:
        """Look up every record the watermark has passed, in (timestamp, id) order; keep of the
        rows only those a waiting or future record can still see; keep the timer at the next due."""
        rows, ttl, key = state["rows"], self.ttl_ms, ctx.key
        due = sorted(k for k in state["waiting"] if k[0] < watermark)
        if due:
            state["waiting"] = [k for k in state["waiting"] if k[0] >= watermark]
            stamps = [r[0] for r in rows]
            for kept in due:
                at = bisect_right(stamps, kept[0]) - 1
                row = rows[at][2] if at >= 0 and (ttl is None or kept[0] < rows[at][0] + ttl) else None
                self.join(ctx, record_of(key, self.stream, kept), row)
        behind = [i for i, r in enumerate(rows) if r[0] < watermark]
        if len(behind) > 1:  # only the newest row behind the watermark can still be seen
            del rows[:behind[-1]]
        if rows and rows[0][0] < watermark and (rows[0][2] is None or ttl is not None and rows[0][0] + ttl <= watermark):
            del rows[0]  # a deletion, or expired: the key has no row as of the watermark
        self.schedule(ctx, state, [*(k[0] + 1 for k in state["waiting"]),
                                   *([rows[0][0] + ttl] if rows and ttl is not None else [])])
        ctx.state = state if rows or state["waiting"] else None
