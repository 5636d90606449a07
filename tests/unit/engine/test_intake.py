"""engine/intake.py and engine/routing.py on a real SQLite store, no Spark: producers route each
record to its consumer interval once, and the one read side takes routed segments, or the
stream's own segments where a batch was not routed for the consumer, to the same records."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from headrace import key_by
from headrace.engine.batch import CheckedRecord, InputRecord, shard_of
from headrace.engine import intake
from headrace.engine.consumer import Consumer, plan_ranges
from headrace.engine.intake import read_keyed, records_of, select
from headrace.engine.publish import publish_injected
from headrace.engine.routing import EMPTY_PLAN, RoutingPlan, Subscriber
from headrace.errors import BadInputError
from headrace.model import ComputationOptions, KeyExtractor
from headrace.schema import StreamSchema
from headrace.store import Store, open_store
from headrace.store.segments import DecodedSegment

STREAM, PRODUCER = "events", "inject:events"


class Poison(dict):  # type: ignore[type-arg]
    """A record its producer can key (it is a dict) but no consumer can decode."""

    def __reduce__(self) -> Any:
        return (_rebuild, ())


def _rebuild() -> None:
    raise ValueError("cannot rebuild")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/store.db")
    yield s
    s.close()


def consumer(name: str = "Count", shards: int = 4, extractor: KeyExtractor | None = None,
             on_error: str = "fail") -> Consumer:
    return Consumer(name, ComputationOptions(shards=shards, on_error=on_error),
                    {STREAM: extractor or key_by("user")}, {STREAM: (PRODUCER,)})


def plan_for(*consumers: Consumer) -> RoutingPlan:
    return RoutingPlan({STREAM: tuple(Subscriber(c.name, c.inputs[STREAM], c.shards) for c in consumers)})


def publish(store: Store, batch: int, values: list[Any], plan: RoutingPlan = EMPTY_PLAN, since: int = 1) -> None:
    if plan.subscribers:
        store.register_plan(plan.id, plan.routes)
    publish_injected(store, PRODUCER, batch, STREAM, [(v, 100 * batch + i, None) for i, v in enumerate(values)],
                     100 * batch, None, None, plan, since)


def take(store: Store, c: Consumer, after: int = 0, shards: set[int] | None = None,
         ) -> tuple[dict[int, list[InputRecord]], list[InputRecord]]:
    """What ``c``'s intervals ``shards`` (all: None) read of the producer's batches past ``after``."""
    ranges = plan_ranges(store, c, {PRODUCER: after}, store.producer_heads([PRODUCER]), {})
    by_shard: dict[int, list[InputRecord]] = {}
    rejected: list[InputRecord] = []
    dests = sorted(shards) if shards is not None else None
    for picked in select(c, read_keyed(store, c, ranges, dests, {}), shards):
        mine, bad = records_of(c, picked)
        for shard, rs in mine.items():
            by_shard.setdefault(shard, []).extend(rs)
        rejected.extend(r for rs in bad.values() for r in rs)
    return by_shard, sorted(rejected, key=lambda r: r.id)


def users(n: int, batch: int) -> list[dict[str, Any]]:
    return [{"user": f"u{i % 7}", "n": batch * 100 + i} for i in range(n)]


def test_routed_segments_and_the_streams_own_give_the_same_records(store: Store) -> None:
    routed, raw = consumer("Routed"), consumer("Raw")
    for batch in (1, 2, 3):
        publish(store, batch, users(20, batch), plan_for(routed))  # routed for one consumer only
    ranges = plan_ranges(store, routed, {}, store.producer_heads([PRODUCER]), {})
    assert [(r.after, r.upto, r.layout) for r in ranges] == [(0, 3, 4)]
    assert [(r.after, r.upto, r.layout) for r in plan_ranges(store, raw, {}, store.producer_heads([PRODUCER]), {})] \
        == [(0, 3, None)]
    assert take(store, routed) == take(store, raw)
    records, rejected = take(store, routed)
    assert rejected == [] and sum(map(len, records.values())) == 60
    assert all(shard_of(r.key, 4) == shard for shard, rs in records.items() for r in rs)
    assert [r.value["n"] for r in records[shard_of("u1", 4)] if r.key == "u1"] == [
        v["n"] for b in (1, 2, 3) for v in users(20, b) if v["user"] == "u1"]  # a key's records in order


@pytest.mark.parametrize("routed, columnar", [
    ("for it", set()),  # its producer's interval is each record's: nothing hashed
    ("for another layout", {"key_shards"}),
    ("not", {"field_shards"}),  # a typed stream's batch 2 (batch 1 has a value with no key field: no columns)
])
@pytest.mark.parametrize("schema", [None, StreamSchema("user STRING, n BIGINT")])
def test_a_long_segments_keys_hashed_in_columns_read_as_a_short_ones_do(
        store: Store, monkeypatch: pytest.MonkeyPatch, routed: str, columnar: set[str],
        schema: StreamSchema | None) -> None:
    c = consumer(on_error="dead_letter")
    plan = {"for it": plan_for(c), "for another layout": plan_for(consumer(shards=3)), "not": EMPTY_PLAN}[routed]
    values: list[Any] = users(60, 1) + [{"n": -1}] + users(9, 2)  # one with no key (interval 0 rejects it)
    if plan.subscribers:
        store.register_plan(plan.id, plan.routes)
    publish_injected(store, PRODUCER, 1, STREAM, [(v, 100 + i, None) for i, v in enumerate(values)], 100, None,
                     schema, plan, 1)
    publish_injected(store, PRODUCER, 2, STREAM, [({"user": f"v{i}", "n": i}, 200 + i, None) for i in range(50)],
                     200, None, schema, plan, 1)  # every record keyed (typed: its keys read from the field column)
    hashed: set[str] = set()
    for name in ("key_shards", "field_shards"):
        def spy(self: Any, *args: Any, _name: str = name, _real: Any = getattr(DecodedSegment, name)) -> Any:
            got = _real(self, *args)
            if got is not None:
                hashed.add(_name)
            return got
        monkeypatch.setattr(DecodedSegment, name, spy)
    one_at_a_time = take(store, c), take(store, c, shards={0, 2})
    assert hashed == set()
    monkeypatch.setattr(intake, "COLUMNAR", 1)
    in_columns = take(store, c), take(store, c, shards={0, 2})
    assert hashed == (columnar if schema is not None or routed != "not" else set())  # untyped: keyed one by one
    assert in_columns == one_at_a_time
    assert [[type(r) for r in rs] for rs in in_columns[0][0].values()] == \
        [[type(r) for r in rs] for rs in one_at_a_time[0][0].values()]
    records, rejected = in_columns[0]
    assert sum(map(len, records.values())) == 119 and [r.value["value"] for r in rejected] == [{"n": -1}]
    assert all(shard_of(r.key, 4) == shard for shard, rs in records.items() for r in rs)


def test_an_intervals_records_are_the_same_built_at_once_or_one_by_one(store: Store) -> None:
    """records_of's one pass (every value decodes) against its record-at-a-time path (one does not)."""
    c = consumer(on_error="dead_letter")
    good = users(40, 1)
    publish(store, 1, good + [Poison(user="u1")])
    publish(store, 2, good)
    records, rejected = take(store, c)
    assert len(rejected) == 1 and rejected[0].value["at"] == "failed decoding it"
    one_by_one = [r for r in records[shard_of("u1", 4)] if r.id.startswith(f"{PRODUCER}:1:")]
    at_once = [r for r in records[shard_of("u1", 4)] if r.id.startswith(f"{PRODUCER}:2:")]
    assert [(type(r), r.stream, r.key, r.value, r.timestamp - 100) for r in one_by_one] == \
        [(type(r), r.stream, r.key, r.value, r.timestamp - 200) for r in at_once]
    assert [r.id.split(":")[-1] for r in one_by_one] == [r.id.split(":")[-1] for r in at_once]


def test_a_typed_streams_checked_records_stay_checked_built_at_once(store: Store) -> None:
    """A segment whose field columns were written under the schema the consumer checks gives
    ``CheckedRecord``s (not checked again), on the one-pass build as on the other."""
    schema = StreamSchema("user STRING, n BIGINT")
    c = Consumer("Count", ComputationOptions(shards=4, on_error="dead_letter"), {STREAM: key_by("user")},
                 {STREAM: (PRODUCER,)}, schemas={STREAM: schema})
    publish_injected(store, PRODUCER, 1, STREAM, [(v, 100 + i, None) for i, v in enumerate(users(30, 1))], 100,
                     None, schema, EMPTY_PLAN, 1)
    records, rejected = take(store, c)
    assert rejected == [] and sum(map(len, records.values())) == 30
    assert {type(r) for rs in records.values() for r in rs} == {CheckedRecord}


def test_each_record_is_keyed_once_however_many_intervals_read_it(store: Store) -> None:
    calls: list[str] = []

    def user_of(value: dict[str, Any]) -> str:
        calls.append(value["user"])
        return str(value["user"])

    c = consumer(extractor=key_by(user_of))
    publish(store, 1, users(50, 1), plan_for(c))
    assert len(calls) == 50  # the producer keyed each record once
    for shard in range(4):  # four workers, each owning one interval, read only what is theirs
        mine, _ = take(store, c, shards={shard})
        assert set(mine) <= {shard}
    assert len(calls) == 50


def test_a_batch_routed_under_another_layout_is_keyed_again_for_the_consumers(store: Store) -> None:
    four, seven = consumer(shards=4), consumer(shards=7)
    publish(store, 1, users(30, 1), plan_for(four))
    assert [r.layout for r in plan_ranges(store, seven, {}, store.producer_heads([PRODUCER]), {})] == [4]
    records, _ = take(store, seven)
    assert sum(map(len, records.values())) == 30
    assert all(shard_of(r.key, 7) == shard for shard, rs in records.items() for r in rs)
    some = sorted(records)[-1]
    assert take(store, seven, shards={some})[0] == {some: records[some]}


def test_batches_routed_and_not_are_read_in_runs_of_their_own(store: Store) -> None:
    c = consumer()
    publish(store, 1, users(5, 1))  # before the consumer was planned: not routed for it
    publish(store, 2, users(5, 2))
    publish(store, 3, users(5, 3), plan_for(c), since=3)
    publish(store, 4, users(5, 4), plan_for(c), since=3)
    ranges = plan_ranges(store, c, {}, store.producer_heads([PRODUCER]), {})
    assert [(r.after, r.upto, r.layout) for r in ranges] == [(0, 2, None), (2, 4, 4)]
    records, _ = take(store, c)
    assert sorted(r.value["n"] for rs in records.values() for r in rs) == sorted(
        v["n"] for b in (1, 2, 3, 4) for v in users(5, b))
    assert [(r.after, r.upto) for r in plan_ranges(store, c, {PRODUCER: 3}, store.producer_heads([PRODUCER]), {})] \
        == [(3, 4)]


@pytest.mark.parametrize("routed", [True, False])
def test_bad_input_is_dead_lettered_alike_whether_routed_or_not(store: Store, routed: bool) -> None:
    c = consumer(on_error="dead_letter")
    publish(store, 1, [{"user": "a", "n": 1}, {"nobody": 2}, Poison(user="b", n=3)], plan_for(c) if routed else EMPTY_PLAN)
    records, rejected = take(store, c)
    assert [r.key for rs in records.values() for r in rs] == ["a"]
    assert [(r.stream, r.key, r.timestamp, r.id) for r in rejected] == [
        (STREAM, "", 101, "inject:events:1:1"), (STREAM, "", 102, "inject:events:1:2")]
    assert rejected[0].value == {
        "computation": "Count", "key": None, "at": "failed extracting its key with key_by('user')", "stream": STREAM,
        "record_id": "inject:events:1:1", "value": {"nobody": 2},
        "error": "InvalidKeyError: key_by('user') found no field 'user' in the record (got {'nobody': 2}). Hint: check "
                 "the field name, or pass a function: key_by(lambda v: ...)"}
    assert rejected[1].value == {
        "computation": "Count", "key": None, "at": "failed decoding it", "stream": STREAM,
        "record_id": "inject:events:1:2", "value": pickle.dumps(Poison(user="b", n=3), pickle.HIGHEST_PROTOCOL),
        "error": "ValueError: cannot rebuild"}
    # a record with no key is interval 0's to reject; one that cannot be decoded its own interval's
    poisoned = shard_of("b", 4) if routed else 0
    assert [r.id for r in take(store, c, shards={0})[1]] == ["inject:events:1:1"] + (
        ["inject:events:1:2"] if poisoned == 0 else [])
    assert [r.id for r in take(store, c, shards=set(range(1, 4)))[1]] == (
        ["inject:events:1:2"] if poisoned != 0 else [])


@pytest.mark.parametrize("routed", [True, False])
@pytest.mark.parametrize("bad, stage, cause", [
    ({"nobody": 2}, "extracting its key with key_by('user')",
     "InvalidKeyError: key_by('user') found no field 'user' in the record (got {'nobody': 2}). Hint: check the "
     "field name, or pass a function: key_by(lambda v: ...)"),
    (Poison(user="b"), "decoding it", "ValueError: cannot rebuild"),
])
def test_bad_input_fails_the_batch_with_an_error_naming_the_record(store: Store, routed: bool, bad: Any,
                                                                    stage: str, cause: str) -> None:
    c = consumer()
    publish(store, 1, [{"user": "a"}, bad], plan_for(c) if routed else EMPTY_PLAN)
    expected = (f"Computation 'Count' cannot take record 'inject:events:1:1' of stream 'events': failed {stage} "
                f"(got {cause}). Hint: fix the record or the key extractor, or add the computation with "
                "on_error='dead_letter' to route such records aside")
    with pytest.raises(BadInputError, match=f"^{re.escape(expected)}$"):
        take(store, c)


def test_a_fence_skips_what_an_earlier_layout_already_took(store: Store) -> None:
    c = consumer(shards=2)
    publish(store, 1, users(20, 1), plan_for(c))
    publish(store, 2, users(20, 2), plan_for(c))
    # an earlier layout of 3 intervals: its interval 1 had read batch 1 already, the others nothing
    fence = ((3, {0: {PRODUCER: 0}, 1: {PRODUCER: 1}, 2: {PRODUCER: 0}}),)
    ranges = plan_ranges(store, c, {}, store.producer_heads([PRODUCER]), {})
    kept = [r for picked in select(c, read_keyed(store, c, ranges, None, {}), None, fence)
            for rs in records_of(c, picked)[0].values() for r in rs]
    expected = [v["n"] for b in (1, 2) for v in users(20, b) if not (b == 1 and shard_of(v["user"], 3) == 1)]
    assert sorted(r.value["n"] for r in kept) == sorted(expected)


def test_interval_0_rejects_bad_input_once_beside_its_own_records(store: Store) -> None:
    c = consumer(shards=1, on_error="dead_letter")  # one interval: its own records and the rejected ones
    publish(store, 1, [{"user": "a", "n": 1}, {"nobody": 2}], plan_for(c))
    records, rejected = take(store, c)
    assert [r.key for r in records[0]] == ["a"] and [r.id for r in rejected] == ["inject:events:1:1"]


def test_a_field_key_of_a_typed_stream_is_read_from_its_columns_unpickling_only_what_is_taken(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from headrace.schema import StreamSchema
    from headrace.store import segments

    # fields in another order than the schema's: the values are unpickled, not built from the columns
    values = [{"n": i * 7919 - 500, "user": f"u{i % 7}"} for i in range(40)]
    publish_injected(store, PRODUCER, 1, STREAM, [(v, 100 + i, None) for i, v in enumerate(values)], 100, None,
                     StreamSchema("user STRING, n BIGINT"), EMPTY_PLAN, 1)  # not routed: keyed by the reader
    loads: list[bytes] = []

    def counted(raw: bytes) -> Any:
        loads.append(raw)
        return pickle.loads(raw)

    monkeypatch.setattr(segments, "pickle", type("P", (), {"loads": staticmethod(counted),
                                                           "dumps": staticmethod(pickle.dumps)}))
    for extractor, key_of in ((key_by("user"), lambda v: v["user"]), (key_by("n", int), lambda v: str(v["n"]))):
        loads.clear()
        c = consumer(extractor=extractor)
        mine, _ = take(store, c, shards={1})
        want = [v for v in values if shard_of(key_of(v), 4) == 1]
        assert want and [(r.key, r.value) for r in mine[1]] == [(key_of(v), v) for v in want]
        assert len(loads) == len(want)  # the keys came from the field columns: only interval 1's values unpickled
        every, _ = take(store, c)
        assert every == take(store, consumer(extractor=key_by(key_of)))[0]  # as a function keys them


def test_key_by_an_int_field_keys_by_its_decimal_text_and_refuses_what_is_not_an_int() -> None:
    from headrace.errors import InvalidKeyError, TopologyError

    extractor = key_by("n", int)
    assert extractor({"n": -42}) == "-42" and extractor.many([{"n": 1}, {"n": 20}]) == ["1", "20"]
    assert extractor.fingerprint != key_by("n").fingerprint
    assert extractor.many([{"n": True}]) is None and extractor.many([{"n": "7"}]) is None
    with pytest.raises(InvalidKeyError, match=re.escape(
            "key_by('n', int) found no int in field 'n' (got '7' of type str). Hint: key_by('n') keys by a str "
            "field; convert others in a function, e.g. key_by(lambda v: str(v['n']))")):
        extractor({"n": "7"})
    with pytest.raises(TopologyError, match=re.escape(
            "key_by('n', kind) takes a field that holds a str or an int (got <class 'float'>). Hint: write "
            "key_by('n') or key_by('n', int)")):
        key_by("n", float)
