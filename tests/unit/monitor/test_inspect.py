"""``headrace.monitor`` on a harness's store, without Spark: the shape of ``status``, and the
errors of ``state``, ``timers`` and ``dead_letters`` (what/got/hint, word for word)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import headrace
from headrace import Computation, Topology, key_by
from headrace.errors import OptionError
from headrace.model import Timer
from headrace.monitor import dead_letters, state, timers
from headrace.monitor.graph import record_topology
from headrace.testing import Harness


class Tally(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value == "boom":
            raise ValueError("boom")
        ctx.state = {"n": (ctx.state or {"n": 0})["n"] + 1}
        ctx.set_timer("flush", 5_000)


def harness(**options: Any) -> Harness:
    h = Harness(Tally, codec="json", **options)
    h.process("a", "x", 10)
    h.process("a", "y", 20)
    return h


def test_status_of_a_harness_store_is_json_and_counts_what_it_processed() -> None:
    h = harness()
    report = headrace.status(h.store.url, now_ms=1_000)
    assert json.loads(json.dumps(report)) == report
    stage = report["stages"]["Tally"]
    assert (stage["kind"], stage["records"], stage["batches"], stage["backlog_records"]) == ("computation", 2, 2, 0)
    assert report["alerts"] == [] and report["now_ms"] == 1_000


def test_state_and_timers_decode_with_the_codec_the_run_recorded() -> None:
    h = harness()
    topology = Topology("t")
    topology.inject("in", [])
    topology.add(Tally, inputs={"in": key_by("k")}, codec="json")
    record_topology(h.store, topology, "continuous", {"in": ["inject:in"]})
    assert state(h.store.url, "Tally", "a") == h.state("a") == {"n": 2}
    assert timers(h.store.url, "Tally", "a") == h.timers("a") == [Timer("flush", 5_000, "watermark")]


def test_a_store_that_does_not_know_the_codec_asks_for_it() -> None:
    h = harness()
    with pytest.raises(OptionError, match=re.escape(
            "The store does not know how to decode the state of 'Tally' (got no codec recorded for it). Hint: pass "
            "the codec it was added with: codec='pickle', 'json', 'msgpack', 'bytes' or your headrace.codecs.Codec")):
        state(h.store.url, "Tally", "a")
    assert state(h.store.url, "Tally", "a", codec="json") == {"n": 2}


def test_an_unknown_computation_or_key_lists_what_exists() -> None:
    h = harness()
    url = h.store.url
    with pytest.raises(OptionError, match=re.escape(
            f"No computation 'Nope' in {url} (got 'Nope'). Hint: known computations are ['Tally']")):
        state(url, "Nope", "a")
    with pytest.raises(OptionError, match=re.escape(
            "Computation 'Tally' holds neither state nor timers for key 'zz' (got 'zz'). "
            "Hint: keys it holds include ['a']")):
        timers(url, "Tally", "zz")


def test_dead_letters_come_back_with_the_error_and_are_refused_where_none_are_sent() -> None:
    h = harness(on_error="dead_letter")
    h.process("b", "boom", 30)
    letters = dead_letters(h.store.url, "Tally")
    assert [(r.value["key"], r.value["value"], r.value["error"]) for r in letters] == [("b", "boom", "ValueError: boom")]
    plain = harness()
    with pytest.raises(OptionError, match=re.escape(
            "Computation 'Tally' sends no dead letters. Hint: add it with on_error='dead_letter' to route the "
            "records its code cannot handle to the stream 'Tally.dead_letter'")):
        dead_letters(plain.store.url, "Tally")


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "10s"])
def test_alert_lag_ms_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(OptionError, match=re.escape(
            f"Computation 'Tally' option 'alert_lag_ms' must be an integer >= 1 (milliseconds) (got {bad!r}). Hint: "
            "e.g. alert_lag_ms=30000 alerts when the watermark is 30 s behind the wall clock; leave it out for no "
            "alert")):
        topology = Topology("t")
        topology.inject("in", [])
        topology.add(Tally, inputs={"in": key_by("k")}, alert_lag_ms=bad)


@pytest.mark.parametrize("bad", [-1, 70_000, "9108", True])
def test_a_metrics_port_must_be_a_port_number(bad: Any) -> None:
    from headrace.monitor.watch import check_metrics_port

    with pytest.raises(OptionError, match=re.escape(
            f"metrics_port must be a TCP port number (0 picks a free one) or None (got {bad!r}). "
            "Hint: e.g. metrics_port=9108, then scrape http://<driver host>:9108/metrics")):
        check_metrics_port(bad)


def test_the_status_text_has_a_line_per_stage_and_one_per_alert() -> None:
    from headrace.monitor.show import status_text

    h = harness()
    h.store.add_event("Tally", "alert", 1_000, json.dumps({"threshold_ms": 500, "lag_ms": 2_500,
                                                           "output_watermark": 0}))
    lines = status_text(headrace.status(h.store.url, now_ms=3_000)).splitlines()
    assert lines[0] == f"headrace status of {h.store.url} at 1970-01-01 00:00:03.000Z"
    assert lines[2].split()[:2] == ["Tally", "beginning"]
    assert lines[3] == ("ALERT Tally: watermark 2.5s behind the wall clock (alert_lag_ms=500) since "
                        "1970-01-01 00:00:01.000Z")
