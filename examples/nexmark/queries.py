"""Nexmark queries q0, q1, q2, q3, q4, q5, q7 and q8, written with headrace's operators.

``topology(query, n, seed)`` injects the first ``n`` events of the generator as the typed streams
``persons``, ``auctions`` and ``bids`` and adds the query's computations; its answer is the stream
``QUERIES[query].output``. ``answer(query, records)`` turns those records into the rows that
``examples/nexmark/oracle.py`` computes with DuckDB from the same events.

Where a streaming answer differs from batch SQL, each query says the rule, and the SQL applies it:
- q3 joins an auction with its seller as of the auction's time (``LookupJoin``, an as-of join):
  a person who appears after the auction does not match it (Flink's q3, a regular join, keeps both
  sides forever and would match it).
- q4's and q5's windows and q7's and q8's are emitted once, when the watermark closes them; the
  SQL groups by the same windows. q4's average per category is emitted at the end of the input.
- q7 keeps the bids whose price is the highest of their own 10-second window (Flink's SQL also
  takes the last millisecond of the previous window, ``BETWEEN rowtime - 10 s AND rowtime``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from headrace import Computation, MonoidComputation, Topology, key_by
from headrace.injectors import RecordsInjector
from headrace.monoids import add, tumbling
from headrace.operators import IntervalJoin, LookupJoin, WindowJoin

from .generator import EVENTS_PER_S, KINDS, SCHEMAS, source

__all__ = ["QUERIES", "Query", "topology", "answer", "inject"]

WINDOW, HOP = 10_000, 2_000


def by(field: str) -> Any:
    """Keys by an integer field of the value, as its decimal text (read from the bus's field columns)."""
    return key_by(field, int)


# -- q0, q1, q2: stateless --------------------------------------------------------------------


class PassThrough(Computation):
    """q0: every bid, as it is."""

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("q0", record.value)


class CurrencyConversion(Computation):
    """q1: every bid, its price in euros."""

    def process_record(self, ctx: Any, record: Any) -> None:
        bid = record.value
        ctx.produce("q1", {"auction": bid["auction"], "bidder": bid["bidder"], "price": 0.908 * bid["price"],
                           "dateTime": bid["dateTime"], "extra": bid["extra"]})


class Selection(Computation):
    """q2: the bids on every 123rd auction."""

    def process_record(self, ctx: Any, record: Any) -> None:
        bid = record.value
        if bid["auction"] % 123 == 0:
            ctx.produce("q2", {"auction": bid["auction"], "price": bid["price"]})


# -- q3: local item suggestion (a lookup join) --------------------------------------------------


class LocalItemSuggestion(LookupJoin):
    """q3: auctions of category 10 whose seller, as of the auction, lives in Oregon, Idaho or California."""

    table, stream = "persons", "auctions"

    def join(self, ctx: Any, auction: Any, seller: Any) -> None:
        if auction.value["category"] == 10 and seller is not None and seller["state"] in ("OR", "ID", "CA"):
            ctx.produce("q3", {"name": seller["name"], "city": seller["city"], "state": seller["state"],
                               "id": auction.value["id"]})


# -- q4: average closing price per category (interval join, then two monoids) ------------------


class BidsInAuction(IntervalJoin):
    """q4, step 1: each bid made while its auction was open."""

    left, right = "auctions", "bids"
    lower_ms = 0

    def upper(self, auction: Any) -> int:
        return auction.value["expires"] - auction.timestamp

    def join(self, ctx: Any, auction: Any, bid: Any) -> None:
        ctx.produce("q4_bids", {"auction": auction.value["id"], "category": auction.value["category"],
                                "expires": auction.value["expires"], "price": bid.value["price"]})


def _higher(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return max(a, b)


class ClosingPrice(MonoidComputation):
    """q4, step 2: an auction's highest bid, once the watermark passes its expiry."""

    combine = staticmethod(_higher)

    def zero(self) -> tuple[int, int]:
        return (-1, -1)

    def lift(self, record: Any) -> tuple[int, int]:
        return (record.value["price"], record.value["category"])

    def window(self, record: Any) -> int:
        return record.value["expires"] + 1

    def emit(self, ctx: Any, timer: Any, best: tuple[int, int]) -> None:
        ctx.produce("q4_closed", {"auction": int(ctx.key), "final": best[0], "category": best[1]})


class AveragePerCategory(MonoidComputation):
    """q4, step 3: the average closing price of each category, once the input has ended."""

    def zero(self) -> tuple[int, int]:
        return (0, 0)

    def lift(self, record: Any) -> tuple[int, int]:
        return (record.value["final"], 1)

    def combine(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])

    def emit(self, ctx: Any, timer: Any, total: tuple[int, int]) -> None:
        ctx.produce("q4", {"category": int(ctx.key), "avg": total[0] / total[1]})


# -- q5: hot items (a sliding window of a monoid, from its panes) ------------------------------


class BidsPerPane(MonoidComputation):
    """q5, step 1: bids per auction and 2-second pane, folded before the shuffle; each pane's count
    goes to the five 10-second windows (sliding every 2 s) that hold the pane."""

    lift = staticmethod(lambda record: 1)
    window = tumbling(HOP)
    combine = add

    def zero(self) -> int:
        return 0

    def emit(self, ctx: Any, timer: Any, count: int) -> None:
        pane_end = timer.timestamp
        for end in range(pane_end, pane_end + WINDOW, HOP):
            ctx.produce("q5_panes", {"end": end, "auction": int(ctx.key), "count": count})


class HotItems(Computation):
    """q5, step 2, keyed by window: the auctions with the most bids in the window, once it closes."""

    def process_record(self, ctx: Any, record: Any) -> None:
        counts = ctx.state
        if counts is None:
            counts = {}
            ctx.set_timer("close", record.value["end"])
        auction = record.value["auction"]
        counts[auction] = counts.get(auction, 0) + record.value["count"]
        ctx.state = counts

    def process_timer(self, ctx: Any, timer: Any) -> None:
        counts = ctx.state
        most = max(counts.values())
        for auction, count in counts.items():
            if count == most:
                ctx.produce("q5", {"start": timer.timestamp - WINDOW, "auction": auction, "num": count})
        ctx.state = None


# -- q7: highest bid (a tumbling window of a monoid) --------------------------------------------


def _highest(a: tuple[int, tuple[Any, ...]], b: tuple[int, tuple[Any, ...]]) -> tuple[int, tuple[Any, ...]]:
    """The higher price with its bids; both lists on a tie (commutative up to the order of bids)."""
    return a if a[0] > b[0] else b if b[0] > a[0] else (a[0], a[1] + b[1])


class HighestBid(MonoidComputation):
    """q7: the bids with the highest price of their 10-second window."""

    window = tumbling(WINDOW)
    combine = staticmethod(_highest)

    def zero(self) -> tuple[int, tuple[Any, ...]]:
        return (-1, ())

    def lift(self, record: Any) -> tuple[int, tuple[Any, ...]]:
        bid = record.value
        return (bid["price"], ((bid["auction"], bid["bidder"], bid["dateTime"], bid["extra"]),))

    def emit(self, ctx: Any, timer: Any, best: tuple[int, tuple[Any, ...]]) -> None:
        for auction, bidder, at, extra in sorted(best[1]):
            ctx.produce("q7", {"auction": auction, "price": best[0], "bidder": bidder, "dateTime": at, "extra": extra})


# -- q8: monitor new users (a window join) ------------------------------------------------------


class NewSellers(WindowJoin):
    """q8: persons who opened an auction in the 10-second window they appeared in."""

    left, right, size_ms = "persons", "auctions", WINDOW

    def join_window(self, ctx: Any, window: Any, persons: list[Any], auctions: list[Any]) -> None:
        if auctions:
            for person in {(p.value["id"], p.value["name"]) for p in persons}:
                ctx.produce("q8", {"id": person[0], "name": person[1], "starttime": window.start})


@dataclass(frozen=True)
class Query:
    name: str
    output: str
    add: Callable[[Topology, dict[str, Any]], Any]  # adds the query's computations to the topology
    columns: tuple[str, ...]  # of the answer's rows, as the oracle's SQL selects them


def _stateless(cls: type[Computation], out: str) -> Callable[[Topology, dict[str, Any]], Any]:
    return lambda t, o: t.add(cls, inputs={"bids": by("auction")}, outputs=[out], **o)


def _q3(t: Topology, o: dict[str, Any]) -> None:
    t.add(LocalItemSuggestion, inputs={"persons": by("id"), "auctions": by("seller")}, outputs=["q3"], **o)


def _q4(t: Topology, o: dict[str, Any]) -> None:
    t.add(BidsInAuction, inputs={"auctions": by("id"), "bids": by("auction")}, outputs=["q4_bids"], **o)
    t.add(ClosingPrice, inputs={"q4_bids": by("auction")}, outputs=["q4_closed"], **o)
    t.add(AveragePerCategory, inputs={"q4_closed": by("category")}, outputs=["q4"], **o)


def _q5(t: Topology, o: dict[str, Any]) -> None:
    t.add(BidsPerPane, inputs={"bids": by("auction")}, outputs=["q5_panes"], **o)
    t.add(HotItems, inputs={"q5_panes": by("end")}, outputs=["q5"], **o)


def _q7(t: Topology, o: dict[str, Any]) -> None:
    t.add(HighestBid, inputs={"bids": key_by(lambda bid: str(bid["dateTime"] // WINDOW))}, outputs=["q7"], **o)


def _q8(t: Topology, o: dict[str, Any]) -> None:
    t.add(NewSellers, inputs={"persons": by("id"), "auctions": by("seller")}, outputs=["q8"], **o)


QUERIES = {q.name: q for q in [
    Query("q0", "q0", _stateless(PassThrough, "q0"), ("auction", "bidder", "price", "dateTime", "extra")),
    Query("q1", "q1", _stateless(CurrencyConversion, "q1"), ("auction", "bidder", "price", "dateTime", "extra")),
    Query("q2", "q2", _stateless(Selection, "q2"), ("auction", "price")),
    Query("q3", "q3", _q3, ("name", "city", "state", "id")),
    Query("q4", "q4", _q4, ("category", "avg")),
    Query("q5", "q5", _q5, ("start", "auction", "num")),
    Query("q7", "q7", _q7, ("auction", "price", "bidder", "dateTime", "extra")),
    Query("q8", "q8", _q8, ("id", "name", "starttime")),
]}
INPUTS = {"q0": ("bids",), "q1": ("bids",), "q2": ("bids",), "q3": ("persons", "auctions"),
          "q4": ("auctions", "bids"), "q5": ("bids",), "q7": ("bids",), "q8": ("persons", "auctions")}


def inject(t: Topology, n: int, seed: int = 1, out_of_order: int = 1, batch_size: int = 10_000,
           kinds: tuple[str, ...] = KINDS, rate: int = EVENTS_PER_S) -> None:
    """The first ``n`` events as the typed streams ``persons``, ``auctions`` and ``bids`` (those of
    ``kinds``), each from an injector of its own whose watermark trails its newest timestamp by
    the disorder of ``out_of_order``; ``rate`` events per second of event time."""
    for kind in kinds:
        t.inject(kind, RecordsInjector(source(kind, n, seed, out_of_order, rate), timestamp="dateTime",
                                       batch_size=batch_size, max_delay_ms=out_of_order * 1_000 // rate + 1,
                                       bounded=True))
        t.stream(kind, schema=SCHEMAS[kind])


def topology(query: str, n: int, seed: int = 1, out_of_order: int = 1, batch_size: int = 10_000,
             name: str | None = None, rate: int = EVENTS_PER_S, **options: Any) -> Topology:
    """The query over the first ``n`` events, on the streams it reads; ``options`` go to every
    computation (``shards=``, ...)."""
    t = Topology(name or f"nexmark_{query}")
    inject(t, n, seed, out_of_order, batch_size, INPUTS[query], rate)
    QUERIES[query].add(t, options)
    return t


def answer(query: str, records: list[Any]) -> list[tuple[Any, ...]]:
    """The query's output records as sorted rows of its columns."""
    columns = QUERIES[query].columns
    return sorted(tuple(r.value[c] for c in columns) for r in records)
