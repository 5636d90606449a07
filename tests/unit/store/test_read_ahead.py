"""store/bus.py ``read_routes_ahead``: a worker's pass reads the routed segments of every
computation it runs in one statement, and each ``read_routes`` call that follows with the same
arguments is served from it, once, with what it would have read itself, on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from headrace import Computation, Topology, key_by
from headrace.engine.ports import RouteRequest
from headrace.engine.publish import publish_injected
from headrace.plans import routing_plan
from headrace.store import open_store

INJECTOR = "inject:words"


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def topology() -> Topology:
    t = Topology("ahead")
    t.inject("words", [])
    t.add(Count, "ByWord", inputs={"words": key_by("w")}, shards=3)
    t.add(Count, "ByLength", inputs={"words": key_by(lambda v: str(len(v["w"])))}, shards=2)
    return t


REQUESTS = [RouteRequest("ByWord", [(INJECTOR, 0, 2)], [0, 2]),
            RouteRequest("ByLength", [(INJECTOR, 1, 3)], None),
            RouteRequest("ByWord", [(INJECTOR, 2, 3)], [1])]


def seen(segments: Any) -> list[tuple[str, int, str, int, list[int]]]:
    return [(s.producer, s.batch, s.stream, s.dest, list(s.seg.timestamps)) for s in segments]


@pytest.fixture
def db(each_store: str) -> Any:
    store = open_store(each_store)
    plan = routing_plan(topology())
    for batch in (1, 2, 3):
        words = [({"w": "w" * (1 + (batch * 7 + i) % 5)}, batch * 100 + i, None) for i in range(20)]
        publish_injected(store, INJECTOR, batch, "words", words, batch * 100, None, None, plan, 1)
    yield store
    store.close()


class Statements:
    """The store's statements, counted."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n, real = 0, store._x

        def counted(sql: str, params: Any = ()) -> Any:
            self.n += 1
            return real(sql, params)

        monkeypatch.setattr(store, "_x", counted)


def test_each_call_after_the_read_ahead_gets_what_it_reads_itself_without_a_statement(
        db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = [seen(db.read_routes(*r)) for r in REQUESTS]
    assert all(alone) and {d for _, _, _, d, _ in alone[0]} == {0, 2} and {d for _, _, _, d, _ in alone[1]} == {0, 1}
    statements = Statements(db, monkeypatch)
    db.read_routes_ahead(REQUESTS)
    assert statements.n == 1
    assert [seen(db.read_routes(*r)) for r in REQUESTS] == alone
    assert statements.n == 1, "every call was served from the read-ahead"


def test_a_call_the_read_ahead_did_not_cover_or_already_served_reads_the_store(
        db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    other = RouteRequest("ByWord", [(INJECTOR, 0, 3)], None)
    expected = seen(db.read_routes(*other)), seen(db.read_routes(*REQUESTS[0]))
    statements = Statements(db, monkeypatch)
    db.read_routes_ahead(REQUESTS)
    assert seen(db.read_routes(*other)) == expected[0]
    assert seen(db.read_routes(*REQUESTS[0])) == seen(db.read_routes(*REQUESTS[0])) == expected[1]
    assert statements.n == 3  # the read-ahead, the uncovered call, the second of the same call
    db.read_routes_ahead(REQUESTS[1:2])  # one call: left to read_routes, and what was left over dropped
    assert statements.n == 3
    assert seen(db.read_routes(*REQUESTS[2])) and statements.n == 4
