"""A segment larger than the store's limit (``HEADRACE_SEGMENT_BYTES``; 256 MiB by default, under
SQLite's and PostgreSQL's 1 GB blob limit) is stored in pieces, transparently to every reader:
the stream's own segments, routed segments, a shard's committed productions, ``read``. Tested
with a limit of a few kilobytes, on both stores."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest

import headrace
from headrace import Computation, Topology, key_by
from headrace.engine.batch import Production
from headrace.engine.publish import publish_injected
from headrace.errors import OptionError
from headrace.plans import routing_plan
from headrace.store import open_store
from headrace.store.segments import DEFAULT_SEGMENT_LIMIT, PIECE_SLOT, pieces, segment_limit, segment_table
from headrace.testing import Harness

LIMIT = 4_000


def rows(db: Any, table: str, producer: str) -> int:
    return int(db._one(f"SELECT COUNT(*) FROM {table} WHERE producer = ?", (producer,))[0])


def test_pieces_keep_every_record_in_order_and_each_under_the_limit() -> None:
    records = [Production("s", f"k{i}", {"i": i, "pad": "x" * (i % 50)}, i, f"r{i}") for i in range(1_000)]
    parts = pieces(segment_table(records), LIMIT)
    assert len(parts) > 10 and all(len(data) <= LIMIT for _, data in parts)
    back = pa.concat_tables([pa.ipc.open_stream(data).read_all() for _, data in parts])
    assert back.column("id").to_pylist() == [r.id for r in records] and sum(n for n, _ in parts) == 1_000
    [(n, data)] = pieces(segment_table([Production("s", "k", "y" * 10_000, 1, "big")]), LIMIT)
    assert n == 1 and len(data) > LIMIT  # one record larger than the limit: a piece of its own


def test_the_limit_defaults_well_under_a_gigabyte_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADRACE_SEGMENT_BYTES", raising=False)
    assert segment_limit() == DEFAULT_SEGMENT_LIMIT == 256 << 20
    monkeypatch.setenv("HEADRACE_SEGMENT_BYTES", "-3")
    with pytest.raises(OptionError, match=re.escape(
            "HEADRACE_SEGMENT_BYTES must be a whole number of bytes >= 1 (got '-3'). Hint: e.g. "
            "HEADRACE_SEGMENT_BYTES=268435456 (256 MiB, the default); leave it unset for that")):
        segment_limit()


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def test_an_injected_batch_over_the_limit_is_split_and_read_back_whole(each_store: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_SEGMENT_BYTES", str(LIMIT))
    topology = Topology("split")
    topology.inject("words", [])
    topology.add(Count, inputs={"words": key_by("w")}, shards=3)
    db = open_store(each_store)
    assert db.segment_limit == LIMIT
    records = [({"w": f"w{i % 7}", "pad": "p" * 40}, i, None) for i in range(2_000)]
    publish_injected(db, "inject:words", 1, "words", records, 0, None, None, routing_plan(topology), 1)
    assert rows(db, "segments", "inject:words") > 10 and rows(db, "routes", "inject:words") > 10
    assert [r.value for _, r in db.read_segments("words", "inject:words", 0, 1)] == [v for v, _, _ in records]
    assert db.segment_records("words", "inject:words", 0, 1) == 2_000
    routed: dict[int, list[int]] = {}
    for seg in db.read_routes("Count", [("inject:words", 0, 1)]):
        routed.setdefault(seg.dest, []).extend(seg.seg.timestamps)
    assert sorted(t for ts in routed.values() for t in ts) == list(range(2_000))
    assert all(ts == sorted(ts) for ts in routed.values())  # each interval's records in the order produced
    db.close()
    assert [r.timestamp for r in headrace.read("words", each_store)] == list(range(2_000))


class Fan(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        for i in range(300):
            ctx.produce("out", {"n": i, "pad": "q" * 30})


def test_a_shards_productions_over_the_limit_commit_in_pieces_and_come_back_whole(
        each_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_SEGMENT_BYTES", str(LIMIT))
    h = Harness(Fan, store=each_store, outputs=["out"], shards=1)
    h.process("k", "go", 10)
    assert rows(h.store, "segments", "Fan") > 2
    assert min(int(s) for (s,) in h.store._all("SELECT shard FROM segments")) == 0  # type: ignore[attr-defined]
    assert max(int(s) for (s,) in h.store._all("SELECT shard FROM segments")) >= PIECE_SLOT  # type: ignore[attr-defined]
    again = h.store.committed_productions("Fan", 0, 1)
    assert [p.value["n"] for p in again] == list(range(300))
    assert [r.value["n"] for r in headrace.read("out", each_store)] == list(range(300))
