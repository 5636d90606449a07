from __future__ import annotations

from typing import Any

from examples.trending.computations import TOP_K, WINDOW_MS, Ranker, oracle
from examples.trending.events import generate
from examples.trending.job import build
from headrace import read, run
from headrace.testing import Harness


def test_trending_top_k_per_topic_and_window_equals_the_oracle(spark: Any, store_url: str, mode: str) -> None:
    events = generate(n=3_000, minutes=20, seed=8)
    expected = oracle(events)
    assert len(expected) >= 12 and any(len(top) == TOP_K for top in expected.values())
    run(build(events, batch_size=400), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    produced = list(read("trending", store_url))
    got = {(r.value["topic"], r.value["window"]): r.value["top"] for r in produced}
    assert len(produced) == len(got)  # every (topic, window) ranked exactly once
    assert got == expected


def test_ranker_on_the_harness_ranks_a_window_once_it_is_complete() -> None:
    h = Harness(Ranker)
    window = 1_767_225_600_000
    end = window + WINDOW_MS
    for event, score in [("a", 5), ("b", 9), ("c", 9), ("d", 1)]:
        h.process("music", {"topic": "music", "event": event, "window": window, "score": score}, end)
    assert h.advance_watermark(end) == []  # records stamped at the window end may still come
    h.process("music", {"topic": "music", "event": "e", "window": window, "score": 7}, end)
    [ranked] = h.advance_watermark(end + 1)
    assert ranked.value == {"topic": "music", "window": window, "top": [["b", 9], ["c", 9], ["e", 7]]}
    assert h.state("music") is None and h.timers("music") == []
