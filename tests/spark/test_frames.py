"""Streams as Spark DataFrames: ``stream_df`` under an unmodified Spark aggregation equals the
oracle, a typed stream's schema is the DataFrame's, and a value that does not fit, produced or
injected, is dead-lettered with the reason (both execution modes)."""

from __future__ import annotations

import pickle
from collections import Counter
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by, read, run, stream_df, table_df
from headrace.errors import OptionError, UnknownStreamError
from headrace.store import open_store

from ..monoids import Adding

USERS = ["ann", "bob", "cy", "dee", "eve"]
BAD = 77  # the event whose production does not fit the schema
# injected values that do not fit the typed input stream: dead-lettered before user code sees them
MISFITS = [{"user": "ann", "n": "not a number", "ts": 1_005}, {"user": "bob", "n": 1, "ts": 1_015, "extra": True}]


def events(n: int = 400) -> list[dict[str, Any]]:
    return [{"user": USERS[i * 7 % len(USERS)], "n": i, "ts": 1_000 + i * 10} for i in range(n)]


class Typed(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        n = record.value["n"]
        ctx.produce("typed", {"user": ctx.key, "n": "seventy-seven" if n == BAD else n})


class TypedSum(Adding):
    """A monoid over the typed stream, folded where it is read: a misfit must not reach the fold."""

    def lift(self, record: Any) -> int:
        return record.value["n"]

    def emit(self, ctx: Any, timer: Any, aggregate: int) -> None:
        ctx.produce("sums", {"user": ctx.key, "total": aggregate})


def build(data: list[dict[str, Any]]) -> Topology:
    t = Topology("frames")
    t.inject("events", injectors.records(data, timestamp="ts", batch_size=50))
    t.stream("events", schema="user STRING, n BIGINT, ts BIGINT")
    t.add(Typed, inputs={"events": key_by("user")}, outputs=["typed"], on_error="dead_letter", shards=2)
    t.stream("typed", schema="user STRING, n BIGINT")
    t.add(TypedSum, inputs={"events": key_by("user")}, outputs=["sums"], on_error="dead_letter", shards=2)
    return t


def test_stream_df_counts_equal_the_oracle_and_a_value_that_does_not_fit_is_dead_lettered(
        spark: Any, store_url: str, mode: str) -> None:
    data = events()
    run(build(data[:1] + MISFITS + data[1:]), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    oracle = Counter(e["user"] for e in data if e["n"] != BAD)

    df = stream_df("typed", spark=spark, store=store_url)
    assert df.isStreaming
    assert df.schema.simpleString() == ("struct<key:string,value:struct<user:string,n:bigint>,timestamp:bigint,"
                                        "id:string,producer:string,batch:bigint>")
    query = (df.groupBy("value.user").count().writeStream.outputMode("complete").format("memory")
             .queryName(f"frames_{mode}").start())
    try:
        query.processAllAvailable()
        counted = {r["user"]: r["count"] for r in spark.sql(f"SELECT * FROM frames_{mode}").collect()}
    finally:
        query.stop()
    assert counted == dict(oracle)

    rows = table_df("typed", spark=spark, store=store_url).collect()
    assert sorted(r.value.n for r in rows) == sorted(e["n"] for e in data if e["n"] != BAD)
    assert {r.id for r in rows} == {r.id for r in read("typed", store_url)}
    assert all(r.timestamp == 1_000 + r.value.n * 10 for r in rows)

    letters = sorted(read("Typed.dead_letter", store_url), key=lambda r: str(r.value["value"]["n"]))
    assert [(r.value["record_id"] is not None, r.value["value"]) for r in letters] == [
        (True, MISFITS[1]), (True, {"user": USERS[BAD * 7 % len(USERS)], "n": BAD, "ts": 1_000 + BAD * 10}),
        (True, MISFITS[0])]
    assert letters[0].value["error"] == (
        "SchemaMismatchError: A value produced to typed stream 'events' does not fit its schema: field 'extra' is "
        "not in the schema (`user` STRING, `n` BIGINT, `ts` BIGINT) (got {'user': 'bob', 'n': 1, 'ts': 1015, "
        "'extra': True}). Hint: produce a dict with the fields `user` STRING, `n` BIGINT, `ts` BIGINT")
    assert letters[1].value["error"].startswith(
        "SchemaMismatchError: A value produced to typed stream 'typed' does not fit its schema: ArrowInvalid: "
        "Could not convert 'seventy-seven' with type str: tried to convert to int64")
    assert letters[2].value["error"].startswith(
        "SchemaMismatchError: A value produced to typed stream 'events' does not fit its schema: ArrowInvalid: "
        "Could not convert 'not a number' with type str: tried to convert to int64")
    assert open_store(store_url).counters("Typed")["dead_lettered"] == 3
    sums = {r.value["user"]: r.value["total"] for r in read("sums", store_url)}
    assert sums == {user: sum(e["n"] for e in data if e["user"] == user) for user in USERS}
    monoid_letters = sorted((r.value["value"]["ts"], r.value["error"][:40]) for r in read("TypedSum.dead_letter",
                                                                                            store_url))
    assert monoid_letters == [(m["ts"], "SchemaMismatchError: A value produced to") for m in MISFITS]
    untyped = table_df("Typed.dead_letter", spark=spark, store=store_url)
    assert untyped.schema["value"].dataType.simpleString() == "binary"
    assert sorted(map(str, (pickle.loads(r.value)["value"]["n"] for r in untyped.collect()))) == sorted(
        map(str, (1, BAD, "not a number")))


def test_a_stream_df_starts_from_a_batch_and_refuses_what_is_not_a_stream(spark: Any, store_url: str) -> None:
    data = events(200)
    run(build(data), store=store_url, spark=spark, progress=None, timeout_s=300, mode="microbatch")
    everything = table_df("events", spark=spark, store=store_url)
    assert everything.count() == 200
    after_two = table_df("events", spark=spark, store=store_url, from_batch=2)
    assert after_two.count() == 100 and after_two.agg({"batch": "min"}).collect()[0][0] == 3
    with pytest.raises(UnknownStreamError, match="^No producer writes stream 'evnets' in .*Hint: known streams are "
                                                 r"\['Typed.dead_letter', 'TypedSum.dead_letter', 'events', 'sums', 'typed'\]$"):
        stream_df("evnets", spark=spark, store=store_url)
    with pytest.raises(OptionError, match=r"^A stream DataFrame starts from 'beginning', 'now' or a time in ms since "
                                          r"the epoch \(got 'start'\). Hint: start='beginning', or from_batch=N to "
                                          r"skip each producer's first N batches$"):
        stream_df("events", spark=spark, store=store_url, start="start")


def test_a_streaming_read_moves_on_records_and_over_batches_without_them_only_now_and_then(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Spark job for batches that hold none of the stream's records (a producer's watermark-only
    or other streams' batches); they are passed over once every ``QUIET_MOVE_S``, so the read's
    position, which retention follows, still moves; a micro-batch reads only ranges with records."""
    from headrace.engine.batch import Production
    from headrace.spark import frames

    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(url)
    store.declare_stream("counts", "Third/0", "Third/1")

    def publish(producer: str, batch: int, n: int) -> None:
        records = [Production("counts", None, {"n": i}, 1_000 + i, f"{producer}:{batch}:{i}") for i in range(n)]
        store.publish(producer, batch, {"counts": records} if n else {}, 1_000 + batch)

    reader = frames.StreamFrameReader({"store": url, "stream": "counts"})
    for batch in (1, 2):
        publish("Third/0", batch, 3)
    publish("Third/1", 1, 0)
    start = reader.latestOffset(reader.initialOffset())
    assert start == {"Third/0": 2, "Third/1": 1}
    assert [(r.producer, r.after, r.upto) for r in reader.partitions({"Third/0": 0, "Third/1": 0}, start)] == [
        ("Third/0", 0, 1), ("Third/0", 1, 2)]  # Third/1's batch holds no record: no read task for it

    publish("Third/0", 3, 0)
    publish("Third/1", 2, 0)
    assert reader.latestOffset(start) == start, "batches without records made a micro-batch"
    publish("Third/1", 3, 2)
    moved = reader.latestOffset(start)
    assert moved == {"Third/0": 3, "Third/1": 3}
    assert [(r.producer, r.after, r.upto) for r in reader.partitions(start, moved)] == [("Third/1", 2, 3)]

    publish("Third/0", 4, 0)
    assert reader.latestOffset(moved) == moved
    monkeypatch.setattr(frames, "QUIET_MOVE_S", 0.0)
    assert reader.latestOffset(moved) == {"Third/0": 4, "Third/1": 3}, "never passed over the quiet batches"
    reader.stop()
    store.close()
