"""What monitoring reads and writes (store/monitoring.py), on each store: positions, segment
counts up to the journal's head, commit times, events and samples."""

from __future__ import annotations

from typing import Any

from headrace.engine.batch import Production
from headrace.store.monitoring import WHOLE_COMPUTATION, Sample


def publish(store: Any, producer: str, batch: int, n: int) -> None:
    records = [Production("s", None, i, 10 * batch, f"{producer}:{batch}:{i}") for i in range(n)]
    store.publish(producer, batch, {"s": records}, 10 * batch)


def test_positions_and_the_records_between_two_batches(store: Any) -> None:
    for batch, n in ((1, 3), (2, 4), (3, 5)):
        publish(store, "inject:s", batch, n)
    store.record_positions("C", WHOLE_COMPUTATION, {"inject:s": 1})
    store.record_positions("C", WHOLE_COMPUTATION, {"inject:s": 2})
    assert store.all_positions("C") == {WHOLE_COMPUTATION: {"inject:s": 2}}
    assert store.records_between("s", "inject:s", 1, 3) == 9
    assert store.records_between("s", "inject:s", 3, 3) == 0
    assert store.records_of(["inject:s", "nobody"]) == 12
    assert store.records_of(["inject:s"], since_ms=0, recent=1) == 5  # the last batch only
    times = store.commit_times(["inject:s"], since_ms=0)["inject:s"]
    assert len(times) == 3 and times == sorted(times)
    assert store.commit_times(["inject:s"], since_ms=max(times) + 1) == {}


def test_commit_times_of_many_producers_in_batch_order_and_only_the_recent_ones(store: Any) -> None:
    for producer, batches in (("C/0", 4), ("C/1", 2), ("C/2", 0)):
        for batch in range(1, batches + 1):
            publish(store, producer, batch, 1)
    every = store.commit_times(["C/0", "C/1", "C/2", "C/0"], since_ms=0)
    assert {p: len(t) for p, t in every.items()} == {"C/0": 4, "C/1": 2}  # C/2 journaled nothing
    assert all(t == sorted(t) for t in every.values())
    assert store.commit_times(["C/0", "C/1"], since_ms=0, recent=1) == {"C/0": every["C/0"][-1:],
                                                                          "C/1": every["C/1"][-1:]}
    assert store.commit_times([], since_ms=0) == {}


def test_events_latest_per_name_and_a_tie_goes_to_the_later_kind(store: Any) -> None:
    store.add_event("A", "alert", 10, "{}")
    store.add_event("A", "cleared", 20, "{}")
    store.add_event("B", "alert", 15, '{"x": 1}')
    store.add_event("B", "cleared", 15, "{}")
    store.add_event("C", "alert", 30, '{"y": 2}')
    latest = store.latest_events(["alert", "cleared"])
    assert {n: (e.at, e.kind) for n, e in latest.items()} == {"A": (20, "cleared"), "B": (15, "cleared"),
                                                              "C": (30, "alert")}
    assert [(e.name, e.kind) for e in store.events(since_ms=15, kinds=("alert",))] == [("B", "alert"), ("C", "alert")]


def test_samples_are_kept_in_order_and_trimmed(store: Any) -> None:
    store.add_samples([Sample("C", at, at * 2, -(2**63), 2**63 - 1, 0) for at in (3, 1, 2)])
    assert [s.at for s in store.samples(0, "C")] == [1, 2, 3]
    assert store.samples(2, "C")[0] == Sample("C", 2, 4, -(2**63), 2**63 - 1, 0)
    assert store.trim_samples(3) == 2
    assert [s.at for s in store.samples(0)] == [3]


def segment_reads(store: Any, reads: Any) -> list[tuple[str, str]]:
    """Each statement on the segments table that ``reads()`` runs (which must answer True), with
    SQLite's query plan for it."""
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)  # each statement as run, its values filled in
    try:
        assert reads()
    finally:
        store._db.set_trace_callback(None)
    return [(sql, " ".join(str(row[-1]) for row in store._db.execute(f"EXPLAIN QUERY PLAN {sql}")))
            for sql in statements if "FROM segments" in sql]


def test_on_sqlite_the_monitors_counts_read_an_index_not_the_segments(tmp_path: Any) -> None:
    """SQLite keeps a row's columns in order: a count of recent records read from the table walks
    every segment's whole ``data`` blob to reach ``created_at`` (67 ms a status round over a 54 MB
    bus). Both of the monitor's counts must be answered from a covering index."""
    from headrace.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "store.db"))
    try:
        publish(store, "inject:s", 1, 3)
        counts = segment_reads(store, lambda: store.records_of(["inject:s"]) == 3
                               and store.records_of(["inject:s"], since_ms=0) == 3)
        assert len(counts) == 2, counts
        for sql, plan in counts:
            assert "USING COVERING INDEX segments_by_time" in plan, (sql, plan)
    finally:
        store.close()


def test_on_sqlite_the_producers_of_a_stream_are_read_from_an_index_not_the_segments(tmp_path: Any) -> None:
    """Each continuous worker asks for its streams' producers once a second: they are answered
    from a covering index, not from the segments' rows and their blobs."""
    from headrace.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "store.db"))
    try:
        publish(store, "inject:s", 1, 3)
        reads = segment_reads(store, lambda: store.stream_producers("s") == ["inject:s"] and "s" in store.streams())
        assert len(reads) == 2, reads
        for sql, plan in reads:
            assert "segments USING COVERING INDEX segments_by_stream" in plan, (sql, plan)
    finally:
        store.close()
