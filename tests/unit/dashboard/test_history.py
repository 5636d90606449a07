"""The dashboard's history: low watermarks and lag from the journal, read incrementally."""

from __future__ import annotations

import time
from pathlib import Path

from headrace.dashboard.history import History, lag_behind, lowest
from headrace.engine.ports import BatchInfo
from headrace.model import BEGINNING_OF_TIME, END_OF_TIME
from headrace.store import open_store

from .test_graph import zeitgeist_graph


def batch(producer: str, n: int, watermark: int, at: int) -> BatchInfo:
    return BatchInfo(producer, n, watermark, watermark, at)


def test_lowest_is_the_minimum_over_parts_once_each_has_a_batch() -> None:
    a = [batch("a", 1, 100, 10), batch("a", 2, 300, 30)]
    b = [batch("b", 1, 200, 20), batch("b", 2, 400, 40)]
    assert lowest([a, b]) == [(10, BEGINNING_OF_TIME), (20, 100), (30, 200), (40, 300)]
    assert lowest([]) == []


def test_lag_is_how_long_ago_the_source_passed_the_stage() -> None:
    source = [(1_000, 10), (2_000, 20), (3_000, 30)]
    points = [(2_500, 15), (3_500, 25), (3_500, 30), (900, 5), (4_000, END_OF_TIME), (1_500, 9)]
    # 15: the source passed it at 2,000; 25: at 3,000; 30: not yet; 5 at 900: the source passes it only later
    assert lag_behind(source, points) == [500, 500, 0, 0, 0, 500]
    assert lag_behind([], [(1_000, 5)]) == [0]


def test_history_reads_the_journal_and_then_only_what_is_new(tmp_path: Path) -> None:
    now = {"ms": 1_800_000_000_000}
    store = open_store(f"sqlite:///{tmp_path}/store.db", clock=lambda: now["ms"])  # stamps each journal row
    graph = zeitgeist_graph()
    store.publish("inject:searches", 1, {}, 1_000)
    store.complete_batch("WindowCounter", 1, 500, 500)
    history = History(store, window_ms=60_000)
    first = history.series(graph, now["ms"])
    assert first["watermarks"]["inject:searches"]["watermark"] == [1_000]
    assert first["watermarks"]["WindowCounter"]["watermark"] == [500]
    assert first["watermarks"]["WindowCounter"]["lag_ms"][0] >= 0
    assert first["watermarks"]["ModelCalculator"] == {"t": [], "watermark": [], "lag_t": [], "lag_ms": []}

    now["ms"] += 600  # each step lands in a half-second point of its own
    store.publish("inject:searches", 2, {}, 2_000)
    now["ms"] += 600
    store.complete_batch("WindowCounter", 2, 1_500, 1_500)
    now["ms"] += 600
    store.publish("inject:searches", 3, {}, END_OF_TIME)
    store.complete_batch("WindowCounter", 3, END_OF_TIME, END_OF_TIME)
    read: list[int] = []
    batches = store.batches
    store.batches = lambda producer, after=0: read.append(after) or batches(producer, after)  # type: ignore[method-assign]
    second = history.series(graph, now["ms"] + 1)
    assert second["watermarks"]["inject:searches"]["watermark"] == [1_000, 2_000, None]
    assert second["watermarks"]["inject:searches"]["lag_ms"] == [0, 0, 0, 0]  # an injector is its own source
    marks = second["watermarks"]["WindowCounter"]
    assert marks["watermark"] == [500, 1_500, None]  # the end of time is not a point in time
    assert marks["lag_ms"][1] >= 600 and marks["lag_ms"][2:] == [0, 0]  # 1,500 was passed by the batch at 2,000
    assert marks["lag_t"][:3] == marks["t"] and marks["lag_t"][3] > marks["t"][2]  # and a point at now
    assert set(read) == {1, 0}  # the injector and WindowCounter from their last batch seen; the rest had none
    store.close()


def test_a_run_that_ended_before_the_window_shows_its_last_minutes(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    graph = zeitgeist_graph()
    store.publish("inject:searches", 1, {}, 1_000)
    store.complete_batch("WindowCounter", 1, 500, 500)
    store.publish("inject:searches", 2, {}, END_OF_TIME)
    ended = int(time.time() * 1000)
    history = History(store, window_ms=60_000)
    live = history.series(graph, ended + 1_000)  # while the window still holds the run
    assert live["watermarks"]["WindowCounter"]["watermark"] == [500]
    later = history.series(graph, ended + 3_600_000)  # an hour after it ended
    assert later["watermarks"]["WindowCounter"]["watermark"] == [500]  # not an empty plot
    assert live["until_ms"] == ended + 1_000 and ended <= later["until_ms"] <= ended + 2_000
    for stage, shown in live["watermarks"].items():
        assert (later["watermarks"][stage]["t"], later["watermarks"][stage]["watermark"]) == (
            shown["t"], shown["watermark"]), stage
    assert History(store, window_ms=60_000).series(graph, ended + 3_600_000) == later  # a fresh page sees the same
    store.close()
