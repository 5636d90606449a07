"""A wrong topology, a bad option or a bad key is refused where it is written, with a message
that says what, what was received, and how to fix it (matched word for word)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from headrace import Computation, Topology, key_by
from headrace.codecs import codec_named
from headrace.errors import InvalidKeyError, OptionError, TopologyError, UnknownStreamError, UserCodeError
from headrace.testing import Harness


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("out", record.value)


class NoHooks(Computation):
    pass


def topology() -> Topology:
    t = Topology("demo")
    t.inject("words", [{"w": "a"}])
    return t


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


def test_unknown_stream() -> None:
    with pytest.raises(TopologyError, match=exact(
            "Computation 'Echo' subscribes to unknown stream 'wrods' (got 'wrods'). "
            "Hint: known streams are ['words']; inject it, or add its producer first")):
        topology().add(Echo, inputs={"wrods": key_by("w")}, outputs=["out"])


def test_a_computation_with_no_hooks() -> None:
    with pytest.raises(TopologyError, match=exact(
            "Computation 'NoHooks' defines neither process_record nor process_timer "
            f"(got {NoHooks!r}). Hint: override process_record(self, ctx, record) and/or "
            "process_timer(self, ctx, timer)")):
        topology().add(NoHooks, inputs={"words": key_by("w")})


def test_a_duplicate_name() -> None:
    t = topology()
    t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"])
    with pytest.raises(TopologyError, match=exact(
            f"Topology 'demo' already has a computation named 'Echo' (got {Echo!r}). "
            "Hint: pass a distinct name: topology.add(cls, name='...')")):
        t.add(Echo, inputs={"words": key_by("w")}, outputs=["out2"])


def test_a_key_extractor_that_is_not_callable() -> None:
    with pytest.raises(TopologyError, match=exact(
            "Computation 'Echo' subscribes to 'words' with a key extractor that is not callable "
            "(got 42 of type int). Hint: use key_by('field') or key_by(lambda value: ...)")):
        topology().add(Echo, inputs={"words": 42}, outputs=["out"])  # type: ignore[dict-item]


def test_a_cycle() -> None:
    t = topology()

    class Back(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.produce("words", record.value)

    t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"])
    with pytest.raises(TopologyError, match=exact(
            "Adding 'Back' would make a cycle through stream 'out' (got ['words']). Hint: low watermarks "
            "cannot advance around a cycle; send feedback through a new injected stream")):
        t.add(Back, inputs={"out": key_by("w")}, outputs=["words"])


def test_an_unknown_option_and_a_bad_choice() -> None:
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' got unknown option 'lateness' (got 'drop'). Hint: valid options are "
            "['codec', 'dedup', 'dedup_slack_ms', 'late', 'on_error', 'productions', 'semantics', 'shards']")):
        topology().add(Echo, inputs={"words": key_by("w")}, lateness="drop")
    with pytest.raises(OptionError, match=exact(
            "Computation 'Echo' option 'late' must be one of ['drop', 'deliver'] (got 'keep'). "
            "Hint: write late='drop'")):
        topology().add(Echo, inputs={"words": key_by("w")}, late="keep")
    with pytest.raises(OptionError, match=exact(
            "Unknown state codec (got 'yaml'). Hint: use one of ['bytes', 'json', 'msgpack', 'pickle'] "
            "or a headrace.codecs.Codec(name, encode, decode)")):
        codec_named("yaml")


def test_a_key_that_is_not_a_str() -> None:
    extractor = key_by(lambda v: v["id"])
    with pytest.raises(InvalidKeyError, match=re.escape(
            "must return a str (got 7 of type int). Hint: convert it in the extractor, "
            "e.g. key_by(lambda v: str(v['user_id']))")):
        extractor({"id": 7})
    with pytest.raises(InvalidKeyError, match=exact(
            "key_by('user') found no field 'user' in the record (got {'id': 7}). "
            "Hint: check the field name, or pass a function: key_by(lambda v: ...)")):
        key_by("user")({"id": 7})


def test_producing_to_an_undeclared_stream_names_it() -> None:
    h = Harness(Echo, outputs=["elsewhere"])
    with pytest.raises(UserCodeError, match=exact(
            "Computation 'Echo' failed on key 'k' at record 'r1' (timestamp 5) (got Computation 'Echo' produced "
            "to undeclared stream 'out' (got 'out'). Hint: declare it: topology.add(..., outputs=['elsewhere', "
            "'out'])). Hint: fix the computation and run again; the batch was not committed and will be retried "
            "from its committed point")):
        h.process("k", "v", 5, id="r1")
    assert isinstance(UnknownStreamError("x"), KeyError)
