"""Poison records (issue 23): what no store can hold is caught where user code hands it over and
dead-lettered (or, under on_error="fail", stops the batch) naming computation, key and record; the
batch still commits. Each case failed at commit with a raw error on the old code."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from headrace import Computation
from headrace.errors import BadInputError, UserCodeError
from headrace.model import key_by
from headrace.testing import Harness

Body = Callable[[Any, Any], None]

CASES: dict[str, tuple[Body, str]] = {
    "unpicklable production": (lambda ctx, r: ctx.produce("out", threading.Lock()),
                               "A value produced to 'out' cannot be pickled for the bus"),
    "production of a lambda": (lambda ctx, r: ctx.produce("out", lambda: 1),
                               "A value produced to 'out' cannot be pickled for the bus"),
    "non-string production key": (lambda ctx, r: ctx.produce("out", 1, key=5), "A production's key must be a str"),
    "surrogate production key": (lambda ctx, r: ctx.produce("out", 1, key="b\udc80"),
                                 "A production's key must be text UTF-8 can hold"),
    "production timestamp over 64 bits": (lambda ctx, r: ctx.produce("out", 1, timestamp=2 ** 70),
                                          "A production timestamp must fit in 64 bits"),
    "production timestamp under 64 bits": (lambda ctx, r: ctx.produce("out", 1, timestamp=-2 ** 63 - 1),
                                           "A production timestamp must fit in 64 bits"),
    "timer over 64 bits": (lambda ctx, r: ctx.set_timer("t", 2 ** 64), "A timer timestamp must fit in 64 bits"),
    "surrogate timer tag": (lambda ctx, r: ctx.set_timer("t\udc80", 5), "A timer tag must be text UTF-8 can hold"),
    "surrogate stream name": (lambda ctx, r: ctx.produce("o\udc80", 1), "A stream name must be text UTF-8 can hold"),
    "counter over 64 bits": (lambda ctx, r: ctx.count("mine", 2 ** 64),
                             "ctx.count takes a counter name of your own and an int"),
}


def computation(body: Body) -> type[Computation]:
    class Poisoned(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.state = "touched"
            ctx.produce("kept", record.value)  # undone with the invocation
            if record.value == "poison":
                body(ctx, record)

    return Poisoned


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_poison_production_or_timer_is_dead_lettered_and_the_batch_commits(case: str) -> None:
    body, message = CASES[case]
    h = Harness(computation(body), on_error="dead_letter")
    h.process("k", "poison", 10, id="bad-1")
    h.process("k", "fine", 20, id="good-1")
    [dead] = h.productions("Poisoned.dead_letter")
    assert dead.value["computation"] == "Poisoned" and dead.value["key"] == "k"
    assert dead.value["record_id"] == "bad-1" and dead.value["value"] == "poison"
    assert message in dead.value["error"]
    assert [r.value for r in h.productions("kept")] == ["fine"]  # the poisoned invocation was undone
    assert h.counters["dead_lettered"] == 1 and h.state("k") == "touched"


@pytest.mark.parametrize("case", sorted(CASES))
def test_under_on_error_fail_a_poison_production_stops_with_computation_key_and_record_named(case: str) -> None:
    body, message = CASES[case]
    h = Harness(computation(body))
    with pytest.raises(UserCodeError, match=r"^Computation 'Poisoned' failed on key 'k' at record 'bad-1' "
                                            r"\(timestamp 10\): " + message.replace("(", r"\(")):
        h.process("k", "poison", 10, id="bad-1")
    assert h.productions("kept") == [] and h.state("k") is None  # nothing of the batch was written


def test_an_input_key_with_a_lone_surrogate_is_dead_lettered_naming_it() -> None:
    h = Harness(computation(lambda ctx, r: None), on_error="dead_letter")
    h.process("a\udc80", "v", 10, id="r1")
    h.process("b", "w", 11, id="r2")
    [dead] = h.productions("Poisoned.dead_letter")
    assert dead.value["key"] == "a\udc80" and dead.value["record_id"] == "r1" and dead.value["value"] == "v"
    assert dead.value["error"] == r"its key 'a\udc80' holds a lone surrogate, which UTF-8 cannot"
    assert [r.value for r in h.productions("kept")] == ["w"]


def test_an_input_timestamp_outside_64_bits_is_dead_lettered_or_fails_naming_the_record() -> None:
    h = Harness(computation(lambda ctx, r: None), on_error="dead_letter")
    h.process("k", "v", 2 ** 64, id="r1")
    [dead] = h.productions("Poisoned.dead_letter")
    assert dead.value["error"] == f"its timestamp {2 ** 64} does not fit in 64 bits"
    with pytest.raises(BadInputError, match=r"^Computation 'Poisoned' cannot take record 'r1' of stream 'input' "
                                            r"under key 'a\\udc80' \(got its key 'a\\udc80' holds a lone surrogate"):
        Harness(computation(lambda ctx, r: None)).process("a\udc80", "v", 10, id="r1")


def test_a_key_extracted_with_a_lone_surrogate_is_bad_input_not_a_failed_commit() -> None:
    h = Harness(computation(lambda ctx, r: None), on_error="dead_letter")
    h.inject("events", [{"user": "ok", "ts": 5}, {"user": "x\udc80", "ts": 6}], key=key_by("user"), timestamp="ts")
    [dead] = h.productions("Poisoned.dead_letter")
    assert dead.value["value"] == {"user": "x\udc80", "ts": 6}
    assert "key_by('user') returned text UTF-8 cannot hold" in dead.value["error"]
    assert [r.value for r in h.productions("kept")] == [{"user": "ok", "ts": 5}]


def test_an_unpicklable_input_value_still_makes_a_writable_dead_letter() -> None:
    lock = threading.Lock()

    class Bad(Computation):
        def process_record(self, ctx: Any, record: Any) -> None:
            raise ValueError("no")

    h = Harness(Bad, on_error="dead_letter")
    h.process("k", lock, 10, id="r1")
    [dead] = h.productions("Bad.dead_letter")
    assert dead.value["value"].startswith("<unpicklable lock: <unlocked _thread.lock object")


def test_an_injected_value_that_cannot_be_pickled_goes_to_the_streams_dead_letters_not_a_failed_publish() -> None:
    h = Harness(computation(lambda ctx, r: None), on_error="dead_letter")
    h.inject("events", [{"user": "a", "ts": 5}, {"user": "b", "ts": 6, "lock": threading.Lock()}], key=key_by("user"),
             timestamp="ts")
    assert [r.value for r in h.productions("kept")] == [{"user": "a", "ts": 5}]
    [dead] = list(h.store.read_segments("events.dead_letter", "inject:events", 0, 10))
    assert dead[1].value["error"] == "the value (dict) cannot be pickled for the bus"
    assert dead[1].value["record_id"] == "inject:events:1:1" and dead[1].id == "inject:events:1:1"


def test_a_state_the_codec_cannot_encode_is_dead_lettered_with_its_invocation_and_the_batch_commits() -> None:
    h = Harness(computation(lambda ctx, r: setattr(ctx, "state", threading.Lock())), on_error="dead_letter")
    h.process("k", "fine", 5, id="good-0")
    h.process("k", "poison", 10, id="bad-1")
    h.process("k", "fine", 20, id="good-1")
    [dead] = h.productions("Poisoned.dead_letter")
    assert dead.value["record_id"] == "bad-1"
    assert dead.value["error"].startswith("UserCodeError: Computation 'Poisoned' cannot save the state of key 'k' "
                                          "with the 'pickle' codec (got lock value: TypeError: cannot pickle")
    assert h.state("k") == "touched" and [r.value for r in h.productions("kept")] == ["fine", "fine"]
