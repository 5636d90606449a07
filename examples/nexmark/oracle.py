"""The same Nexmark queries as SQL, evaluated by DuckDB over the same bounded event set: the
independent oracle of examples/nexmark/queries.py. Each SQL is Nexmark's (as Flink's nexmark
repository writes it) with the streaming rules of queries.py applied: windows as fixed groups of
``dateTime``, q3 as an as-of join, q7 over each bid's own window.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .generator import EVENTS_PER_S, KINDS, SCHEMAS, events

__all__ = ["SQL", "tables", "evaluate"]

SQL = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bids",
    "q1": "SELECT auction, bidder, 0.908::DOUBLE * price AS price, dateTime, extra FROM bids",
    "q2": "SELECT auction, price FROM bids WHERE auction % 123 = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id
             FROM auctions A ASOF JOIN persons P ON A.seller = P.id AND A.dateTime >= P.dateTime
             WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')""",
    "q4": """SELECT Q.category, AVG(Q.final) AS avg FROM (
               SELECT MAX(B.price) AS final, A.category FROM auctions A, bids B
               WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
               GROUP BY A.id, A.category) Q
             GROUP BY Q.category""",
    "q5": """WITH hop AS (SELECT auction, dateTime - dateTime % 2000 - 2000 * j AS start
                          FROM bids, range(5) AS r(j)),
                  counts AS (SELECT start, auction, count(*) AS num FROM hop GROUP BY start, auction)
             SELECT C.start, C.auction, C.num FROM counts C
             JOIN (SELECT start, max(num) AS maxn FROM counts GROUP BY start) M
               ON C.start = M.start AND C.num >= M.maxn""",
    "q7": """SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra FROM bids B
             JOIN (SELECT max(price) AS maxprice, dateTime // 10000 AS w FROM bids GROUP BY w) M
               ON B.price = M.maxprice AND B.dateTime // 10000 = M.w""",
    "q8": """SELECT P.id, P.name, P.starttime FROM
               (SELECT id, name, dateTime - dateTime % 10000 AS starttime FROM persons
                GROUP BY id, name, starttime) P
             JOIN (SELECT seller, dateTime - dateTime % 10000 AS starttime FROM auctions
                   GROUP BY seller, starttime) A
               ON P.id = A.seller AND P.starttime = A.starttime""",
}

_ARROW = {"BIGINT": pa.int64(), "STRING": pa.string()}


def tables(n: int, seed: int = 1, out_of_order: int = 1, rate: int = EVENTS_PER_S) -> dict[str, pa.Table]:
    """The first ``n`` events as three Arrow tables, one per kind, columns as in ``SCHEMAS``."""
    columns: dict[str, dict[str, list[Any]]] = {
        kind: {c.split()[0]: [] for c in SCHEMAS[kind].split(", ")} for kind in KINDS}
    for kind, value in events(n, seed, out_of_order, rate):
        for name, column in columns[kind].items():
            column.append(value[name])
    return {kind: pa.table({name: pa.array(values, _ARROW[t.split()[1]])
                            for (name, values), t in zip(columns[kind].items(), SCHEMAS[kind].split(", "))})
            for kind in KINDS}


def evaluate(query: str, data: dict[str, pa.Table]) -> list[tuple[Any, ...]]:
    """The query's answer, by DuckDB, as sorted rows."""
    import duckdb

    con = duckdb.connect()
    for kind, table in data.items():
        con.register(kind, table)
    return sorted(tuple(row) for row in con.execute(SQL[query]).fetchall())
