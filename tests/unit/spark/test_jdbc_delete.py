"""The JDBC sink's DELETE (spark/sinks.py ``JdbcWrite._delete``) finds the table Spark's writer
made: Spark sends the table name as SQL text, so an unquoted mixed-case name is folded to lower
case, a quoted one kept, a schema-qualified one looked up in its schema. On a real PostgreSQL."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from headrace import Computation, Topology, key_by
from headrace.spark.sinks import JdbcWrite


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("out", record.value)


@pytest.mark.parametrize("table, created", [
    ("Counts", "Counts"),  # Spark's CREATE TABLE Counts makes the table counts
    ("public.Counts", "public.Counts"),
    ('"MixedCase"', '"MixedCase"'),
    ('odd."We Ird"', 'odd."We Ird"'),
])
def test_the_delete_replaces_the_rows_of_the_table_spark_made(postgres_server: Any, table: str, created: str) -> None:
    url = postgres_server.new_database()
    parts = urlsplit(url)
    jdbc = f"jdbc:postgresql://{parts.hostname}:{parts.port}{parts.path}?user={parts.username}"
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE SCHEMA odd")
        db.execute(f"CREATE TABLE {created} (key TEXT, producer TEXT, batch BIGINT)")  # as Spark's writer sends it
        db.execute(f"INSERT INTO {created} VALUES ('a', 'Echo', 1), ('b', 'Echo', 2), ('c', 'other', 1)")
    t = Topology("jdbc")
    t.inject("words", [])
    t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"])
    spec = t.sink("out", jdbc=jdbc, table=table)
    JdbcWrite(spec, typed=False)._delete([("Echo", 1)])
    with psycopg.connect(url) as db:
        assert sorted(db.execute(f"SELECT key FROM {created}").fetchall()) == [("b",), ("c",)]
