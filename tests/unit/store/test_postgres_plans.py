"""store/postgres.py: a writer's reads of the journal stay index lookups however stale the sizes
the server plans from (``INDEX_PLANS``). The server records a table's size at a VACUUM (a trim's,
autovacuum's) and plans a prepared statement once, generically, from it: a journal recorded at a
few rows and grown to thousands since was read whole, every pass of every worker."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from headrace.store import open_store

PRODUCERS = ["C/0", "C/1", "C/2", "C/3", "inject:events"]
GROWN_TO = 3_000  # batches per producer once the plans are made


def _heads(store: Any) -> Any:
    return store.journal_heads_of(PRODUCERS)


def _latest(store: Any) -> Any:
    return store.latest_batch("inject:events")


def _low_watermarks(store: Any) -> Any:
    return store.low_watermarks("C")


# what each read runs, told by its text, and the literal arguments to run it with again
READS: dict[str, tuple[Callable[[Any], Any], str, str]] = {
    "a worker's read of its producers' heads": (_heads, "%plan_since%", "'{" + ",".join(PRODUCERS) + "}'"),
    "an injector's read of its last batch": (_latest, "%completed_at FROM batches WHERE producer%", "'inject:events'"),
    "the authority's read of a computation's watermarks": (_low_watermarks, "SELECT COUNT(*)%", "'C'"),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_journal_read_stays_an_index_lookup_after_the_journal_grew_past_its_recorded_size(
        postgres_server: Any, read: str) -> None:
    call, text, arguments = READS[read]
    url = postgres_server.new_database()
    store = open_store(url)
    try:
        store.register("C", 4)
        for producer in PRODUCERS:
            store.complete_batch(producer, 1, 0, 0)
        store._x("VACUUM batches")  # the server's size of the journal: five rows
        store._x("SET plan_cache_mode = force_generic_plan")  # as a prepared statement's plan, planned once
        for _ in range(6):  # psycopg prepares a statement at its fifth run
            call(store)
        store._x("INSERT INTO batches SELECT p, b, b, b, b, NULL, NULL FROM unnest(?::text[]) AS v(p), "
                 "generate_series(2, ?) AS g(b)", (PRODUCERS, GROWN_TO))
        assert call(store) is not None
        (name,) = store._one("SELECT name FROM pg_prepared_statements WHERE statement LIKE ? AND name <> ''",
                             (text,))
        (plan,) = store._one(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}({arguments})")
        top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
        pages = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
        assert pages <= 10 * len(PRODUCERS), (
            f"{read} read {pages} pages of a journal of {GROWN_TO * len(PRODUCERS)} rows: {json.dumps(top)[:2000]}")
    finally:
        store.close()


def test_the_heads_read_after_the_growth_gives_each_producers_last_batch(postgres_server: Any) -> None:
    store = open_store(postgres_server.new_database())
    try:
        for producer in PRODUCERS:
            store.complete_batch(producer, 1, 0, 0)
        store._x("VACUUM batches")
        for _ in range(6):
            _heads(store)
        store._x("INSERT INTO batches SELECT p, b, b, b, b, NULL, NULL FROM unnest(?::text[]) AS v(p), "
                 "generate_series(2, ?) AS g(b)", (PRODUCERS, GROWN_TO))
        heads = _heads(store)
        assert {p: (h.batch, h.output_watermark) for p, h in heads.items()} == {p: (GROWN_TO, GROWN_TO)
                                                                                for p in PRODUCERS}
    finally:
        store.close()
