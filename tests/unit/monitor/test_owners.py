"""Checked when a run starts, before Spark does (monitor/owners.py): a computation whose codec
changed while it holds state, and a topology sharing a computation or a stream with another one
recorded on the store, are refused naming both; ``recode_state`` migrates a codec."""

from __future__ import annotations

import re
from typing import Any

import pytest

import headrace
from headrace import Computation, Topology, key_by
from headrace.codecs import CODECS, Codec, fingerprint
from headrace.errors import OptionError
from headrace.monitor import recode_state, state
from headrace.monitor.graph import record_topology
from headrace.monitor.owners import record_codecs
from headrace.plans import producers_of
from headrace.store import open_store
from headrace.testing import Harness


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = {"n": ((ctx.state or {"n": 0})["n"]) + 1}


def topology(name: str = "counts", codec: Any = "pickle", computation: str = "Count",
             stream: str = "words") -> Topology:
    t = Topology(name)
    t.inject(stream, [{"w": "a", "ts": 1}])
    t.add(Count, name=computation, inputs={stream: key_by("w")}, codec=codec)
    return t


def ran(url: str, t: Topology) -> None:
    """What a run of ``t`` leaves: its graph, its codecs, and a key's state in its codec."""
    db = open_store(url)
    record_topology(db, t, "microbatch", {s: producers_of(t, s, "microbatch") for s in t.streams()})
    record_codecs(db, t)
    db.close()
    for name, spec in t.computations.items():
        Harness(Count, name=name, store=url, codec=spec.options.codec).process("a", {"w": "a"}, 1)


def test_a_run_whose_codec_differs_from_the_stored_one_fails_at_start_naming_both(each_store: str) -> None:
    ran(each_store, topology(codec="pickle"))
    shown = open_store(each_store).shown_url
    with pytest.raises(OptionError, match=re.escape(
            f"Computation 'Count' holds state in codec 'pickle' on {shown}, and this run gives it codec 'json' (got "
            "'json'). Hint: add it with the codec its state is in, or, with the topology stopped, migrate its state: "
            "headrace.monitor.recode_state(store, 'Count', old=<codec 'pickle'>, new=<codec 'json'>)")):
        headrace.run(topology(codec="json"), store=each_store, progress=None, mode="microbatch")


def test_recode_state_migrates_and_the_run_then_passes_the_check(each_store: str) -> None:
    ran(each_store, topology(codec="pickle"))
    assert recode_state(each_store, "Count", "pickle", "json") == 1
    assert state(each_store, "Count", "a", codec="json") == {"n": 1}
    from headrace.monitor.owners import check_owners
    db = open_store(each_store)
    check_owners(db, topology(codec="json"))  # no longer refused
    with pytest.raises(OptionError, match=re.escape("Computation 'Count' holds state in codec 'json', not the old "
                                                    "codec given (got 'pickle'). Hint: pass old= the codec 'json'")):
        recode_state(each_store, "Count", "pickle", "msgpack")
    db.close()


def test_a_codec_of_ones_own_is_told_apart_from_a_built_in_of_the_same_name() -> None:
    mine = Codec("json", CODECS["json"].encode, lambda b: b)
    assert fingerprint(CODECS["json"]) == "json"
    assert fingerprint(mine).startswith("json (headrace.codecs.<lambda>, tests.unit.monitor.test_owners.")


def test_a_new_codec_on_a_computation_holding_no_state_is_not_refused(each_store: str) -> None:
    db = open_store(each_store)
    t = topology(codec="pickle")
    record_topology(db, t, "microbatch", {s: producers_of(t, s, "microbatch") for s in t.streams()})
    record_codecs(db, t)
    from headrace.monitor.owners import check_owners
    check_owners(db, topology(codec="json"))
    db.close()


@pytest.mark.parametrize("shared, other", [("computation 'Count'", topology("other", stream="lines")),
                                           ("stream 'words'", topology("other", computation="Tally"))])
def test_a_second_topology_sharing_a_name_fails_at_start_naming_the_owner(each_store: str, shared: str,
                                                                         other: Topology) -> None:
    ran(each_store, topology("counts"))
    shown = open_store(each_store).shown_url
    with pytest.raises(OptionError, match=re.escape(
            f"Topology 'other' cannot run on {shown}: topology 'counts' owns its {shared} (got 'other'). Hint: "
            "rename them in one of the two, or run 'other' on a store of its own; if 'counts' is this topology "
            "under an old name, delete the store's meta row 'topology:counts'")):
        headrace.run(other, store=each_store, progress=None, mode="microbatch")
