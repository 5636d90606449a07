"""Every operator of headrace.operators as a test case, with out-of-order and late input and its
oracle in SQL, evaluated by DuckDB over the same records. The harness tests (tests/unit/operators),
the Spark tests in both modes (tests/spark/test_operators.py) and the kill test
(tests/chaos/test_operators_chaos.py) all run these.

The input of a case comes in three phases, on one or two injected streams:
1. records out of order by up to ``DISORDER`` ms, while the watermark trails the newest timestamp by
   ``DISORDER`` (an injector with ``max_delay_ms=DISORDER``): none of them is late;
2. once the consumer's watermark has reached ``T_LATE`` (the watermark phase 1 ends with), records
   behind it: late, some within the operators' allowed lateness and some past it;
3. more records in order, then the end of the input.

The rule both sides apply: a record's ``wm`` is the watermark it arrives behind (``T_LATE`` in
phase 2, the beginning of time otherwise), the same on the harness and on Spark (the Spark
injectors wait for the watermark, so a phase 2 record always arrives at exactly ``T_LATE``). A
record with ``ts < wm`` is late; what a late record does is each operator's stated policy, written
into its SQL. A window emitted more than once counts with its last emission.
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from headrace import key_by
from headrace.model import BEGINNING_OF_TIME
from headrace.operators import (Deduplicate, IntervalJoin, LookupJoin, SessionWindow, SlidingWindow,
                                TumblingWindow, WindowJoin)

BASE = 1_700_000_000_000
DISORDER = 700
KEYS = ["a", "b", "c", "d"]
PHASE1, PHASE2, PHASE3 = 200, 10, 40  # records per stream; phase 1 and 3 are multiples of the batch size
BATCH = 20


def records(stream: str, seed: int, spacing: int = 97) -> list[dict[str, Any]]:
    """One stream's records in arrival order (``phase`` 1, 2, 3; ``wm`` as above)."""
    rng = random.Random(f"{stream}-{seed}")
    first = [{"k": rng.choice(KEYS), "ts": BASE + i * spacing} for i in range(PHASE1)]
    arrival = sorted(range(PHASE1), key=lambda i: i * spacing + rng.uniform(0, DISORDER))
    out = [{**first[i], "phase": 1} for i in arrival]
    top = BASE + (PHASE1 - 1) * spacing
    behind = [DISORDER + 50, 2_000, 4_000, 9_000, 15_000]
    late = [{"k": rng.choice(KEYS), "ts": top - behind[i % len(behind)] - i, "phase": 2} for i in range(PHASE2)]
    out += late
    out += [{"k": rng.choice(KEYS), "ts": top + (i + 1) * spacing, "phase": 3} for i in range(PHASE3)]
    return [{**r, "stream": stream, "n": rng.randrange(1, 1000)} for r in out]


def t_late(streams: dict[str, list[dict[str, Any]]]) -> int:
    """The watermark phase 1 ends with: the newest phase 1 timestamp, less the disorder, over every stream."""
    return min(max(r["ts"] for r in rs if r["phase"] == 1) for rs in streams.values()) - DISORDER


def with_wm(streams: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    late_at = t_late(streams)
    return [{**r, "wm": late_at if r["phase"] == 2 else BEGINNING_OF_TIME, "id": f"{r['stream']}-{i}"}
            for rs in streams.values() for i, r in enumerate(rs)]


# -- the operators under test --------------------------------------------------------------------


class TumblingSum(TumblingWindow):
    out = "out"
    size_ms = 1_000
    allowed_lateness_ms = 3_000
    late_stream = "too_late"
    zero = staticmethod(lambda: 0)
    combine = staticmethod(operator.add)

    def lift(self, record: Any) -> int:
        return record.value["n"]

    def emit(self, ctx: Any, window: Any, total: int) -> None:
        ctx.produce(self.out, {"k": ctx.key, "start": window.start, "end": window.end, "v": total})


class Counting:
    """A count as a window's fold."""

    def zero(self) -> int:
        return 0

    def lift(self, record: Any) -> int:
        return 1

    def combine(self, a: int, b: int) -> int:
        return a + b


class SlidingCount(Counting, SlidingWindow):
    out = "out"
    size_ms, slide_ms = 2_000, 500  # no lateness, no late stream: the engine drops late records

    def emit(self, ctx: Any, window: Any, count: int) -> None:
        ctx.produce(self.out, {"k": ctx.key, "start": window.start, "end": window.end, "v": count})


class SessionMax(SessionWindow):
    out = "out"
    gap_ms = 300
    allowed_lateness_ms = 5_000  # late records within it reopen (and may merge) closed sessions

    def zero(self) -> int:
        return 0

    def lift(self, record: Any) -> int:
        return record.value["n"]

    def combine(self, a: int, b: int) -> int:
        return max(a, b)

    def emit(self, ctx: Any, window: Any, best: int) -> None:
        ctx.produce(self.out, {"k": ctx.key, "start": window.start, "end": window.end, "v": best})


class PairsWithin(IntervalJoin):
    out = "out"
    left, right = "left", "right"
    lower_ms, upper_ms = -200, 400

    def join(self, ctx: Any, left: Any, right: Any) -> None:
        ctx.produce(self.out, {"k": ctx.key, "l": left.value["n"], "r": right.value["n"],
                            "lts": left.timestamp, "rts": right.timestamp})


class WindowPairs(WindowJoin):
    out = "out"
    left, right, size_ms = "left", "right", 1_000

    def join_window(self, ctx: Any, window: Any, lefts: list[Any], rights: list[Any]) -> None:
        if lefts and rights:
            ctx.produce(self.out, {"k": ctx.key, "start": window.start, "nl": len(lefts), "nr": len(rights),
                                "sl": sum(r.value["n"] for r in lefts), "sr": sum(r.value["n"] for r in rights)})


class AsOf(LookupJoin):
    out = "out"
    table, stream = "left", "right"
    ttl_ms = 2_500

    def join(self, ctx: Any, record: Any, row: Any) -> None:
        ctx.produce(self.out, {"k": ctx.key, "ts": record.timestamp, "n": record.value["n"],
                            "row": None if row is None else row["n"]})


class Dedup(Deduplicate):
    out = "out"
    within_ms = 250

    def emit(self, ctx: Any, record: Any) -> None:
        ctx.produce(self.out, {"k": ctx.key, "ts": record.timestamp, "n": record.value["n"]})


# -- cases: the operator, its input streams, its oracle and how to read its output --------------


@dataclass
class Case:
    name: str
    cls: type
    streams: tuple[str, ...]
    sql: str  # over the table ``events(stream, k, n, ts, phase, wm, id)``; rows sorted to compare
    observe: Callable[[list[Any]], list[tuple[Any, ...]]]  # the output records -> rows like the SQL's
    outputs: tuple[str, ...] = ("out",)
    late_side: Callable[[list[Any]], list[tuple[Any, ...]]] | None = None  # the too_late stream -> rows
    late_sql: str | None = None
    spacing: int = 97
    options: dict[str, Any] = field(default_factory=dict)

    def inputs(self) -> dict[str, Any]:
        return {s: key_by("k") for s in self.streams}

    def named(self, prefix: str) -> tuple[type, dict[str, Any], list[str]]:
        """The case's operator with every stream it names prefixed (so that several cases share a
        topology): the class, its inputs and its outputs."""
        renamed = {a: f"{prefix}{getattr(self.cls, a)}" for a in ("left", "right", "table", "stream", "late_stream", "out")
                   if isinstance(getattr(self.cls, a, None), str)}
        cls = type(f"{self.cls.__name__}_{prefix.strip('_')}", (self.cls,), renamed)
        return cls, {f"{prefix}{s}": key_by("k") for s in self.streams}, [f"{prefix}{o}" for o in self.outputs]

    def data(self, seed: int) -> dict[str, list[dict[str, Any]]]:
        return {s: records(s, seed, self.spacing) for s in self.streams}  # one spacing: every stream ends phase 1 at T_LATE


def last_per(rows: list[Any], key: Callable[[dict[str, Any]], Any]) -> dict[Any, dict[str, Any]]:
    """The last emission of each window (records in production order)."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        out[key(r.value)] = r.value
    return out


def windows_seen(rows: list[Any]) -> list[tuple[Any, ...]]:
    last = last_per(rows, lambda v: (v["k"], v["start"]))
    return sorted((v["k"], v["start"], v["end"], v["v"]) for v in last.values())


def sessions_seen(rows: list[Any]) -> list[tuple[Any, ...]]:
    """The sessions emitted last: each emission replaces the earlier ones of its key it overlaps
    (a late record can reopen a session, or merge two)."""
    final: list[dict[str, Any]] = []
    for r in rows:
        v = r.value
        final = [f for f in final if not (f["k"] == v["k"] and f["start"] < v["end"] and v["start"] < f["end"])]
        final.append(v)
    return sorted((v["k"], v["start"], v["end"], v["v"]) for v in final)


LATE_ROWS = "SELECT k, ts, n FROM events WHERE {} ORDER BY ALL"

CASES = [
    Case("tumbling", TumblingSum, ("events",),
         # too late: the window's end plus the 3 s lateness is at or behind the watermark it arrived at
         """SELECT k, ts - ts % 1000 AS start, ts - ts % 1000 + 1000 AS "end", sum(n) AS v FROM events
            WHERE ts - ts % 1000 + 1000 + 3000 > wm GROUP BY ALL ORDER BY ALL""",
         windows_seen, outputs=("out", "too_late"),
         late_side=lambda rows: sorted((r.value["k"], r.value["ts"], r.value["n"]) for r in rows),
         late_sql=LATE_ROWS.format("ts - ts % 1000 + 1000 + 3000 <= wm")),
    Case("sliding", SlidingCount, ("events",),
         # no lateness: a record behind the watermark is dropped by the engine
         """SELECT k, s AS start, s + 2000 AS "end", count(*) AS v
            FROM (SELECT k, ts - ts % 500 - 500 * j AS s, ts FROM events, range(4) AS r(j) WHERE ts >= wm)
            WHERE s + 2000 > ts GROUP BY ALL ORDER BY ALL""",
         windows_seen),
    Case("session", SessionMax, ("events",),
         # a late record is too late only if its own session [ts, ts + 300) closed 5 s before the
         # watermark it arrived at (none of the data's late records touches a purged session)
         """WITH kept AS (SELECT * FROM events WHERE ts + 300 + 5000 > wm),
            marked AS (SELECT *, CASE WHEN ts - lag(ts) OVER w < 300 THEN 0 ELSE 1 END AS first
                       FROM kept WINDOW w AS (PARTITION BY k ORDER BY ts)),
            numbered AS (SELECT *, sum(first) OVER (PARTITION BY k ORDER BY ts) AS session FROM marked)
            SELECT k, min(ts) AS start, max(ts) + 300 AS "end", max(n) AS v FROM numbered
            GROUP BY k, session ORDER BY ALL""",
         sessions_seen, spacing=211, options={"shards": 2}),
    Case("interval_join", PairsWithin, ("left", "right"),
         """SELECT l.k, l.n, r.n, l.ts, r.ts FROM events l JOIN events r
            ON l.k = r.k AND r.ts BETWEEN l.ts - 200 AND l.ts + 400
            WHERE l.stream = 'left' AND r.stream = 'right' AND l.ts >= l.wm AND r.ts >= r.wm ORDER BY ALL""",
         lambda rows: sorted((v["k"], v["l"], v["r"], v["lts"], v["rts"]) for v in (r.value for r in rows))),
    Case("window_join", WindowPairs, ("left", "right"),
         """SELECT k, ts - ts % 1000 AS start, count(*) FILTER (stream = 'left') AS nl,
                   count(*) FILTER (stream = 'right') AS nr, sum(n) FILTER (stream = 'left') AS sl,
                   sum(n) FILTER (stream = 'right') AS sr
            FROM events WHERE ts >= wm GROUP BY ALL HAVING nl > 0 AND nr > 0 ORDER BY ALL""",
         lambda rows: sorted((v["k"], v["start"], v["nl"], v["nr"], v["sl"], v["sr"]) for v in (r.value for r in rows))),
    Case("lookup_join", AsOf, ("left", "right"),
         """SELECT p.k, p.ts, p.n, CASE WHEN p.ts < t.ts + 2500 THEN t.n END AS row
            FROM (SELECT * FROM events WHERE stream = 'right' AND ts >= wm) p
            ASOF LEFT JOIN (SELECT * FROM events WHERE stream = 'left' AND ts >= wm) t
            ON p.k = t.k AND p.ts >= t.ts ORDER BY ALL""",
         lambda rows: sorted((v["k"], v["ts"], v["n"], v["row"]) for v in (r.value for r in rows))),
    Case("dedup", Dedup, ("events",),
         """SELECT k, ts, n FROM (SELECT *, ts - lag(ts) OVER (PARTITION BY k ORDER BY ts, n) AS since
                                  FROM events WHERE ts >= wm)
            WHERE since IS NULL OR since > 250 ORDER BY ALL""",
         lambda rows: sorted((v["k"], v["ts"], v["n"]) for v in (r.value for r in rows))),
]
BY_NAME = {c.name: c for c in CASES}


def oracle(case: Case, seed: int, sql: str | None = None) -> list[tuple[Any, ...]]:
    """The case's SQL over its records, in DuckDB."""
    import duckdb
    import pyarrow as pa

    rows = with_wm(case.data(seed))
    table = pa.table({name: [r[name] for r in rows] for name in ("stream", "k", "n", "ts", "phase", "wm", "id")})
    con = duckdb.connect()
    con.register("events", table)
    return [tuple(r) for r in con.execute(sql or case.sql).fetchall()]
