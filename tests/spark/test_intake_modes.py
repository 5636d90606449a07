"""One intake for every runtime (engine/intake.py): the same input fixtures (good records, one
with no key, one whose value cannot be decoded, one that does not fit its typed stream) run
once on the harness, once in micro-batch mode and once in continuous mode, and give equal
outputs, equal dead letters (value, error, record id) and, under ``on_error="fail"``, the same
keying error. The input watermarks of the runtimes are compared in
tests/unit/test_watermark_modes.py (they need no Spark)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by, read, run
from headrace.errors import UserCodeError
from headrace.testing import Harness

SCHEMA = "user STRING, n BIGINT, ts BIGINT"


class Poison(dict):  # type: ignore[type-arg]
    """A record its producer keys (it is a dict with a user) but no consumer can decode."""

    def __reduce__(self) -> Any:
        return (_rebuild, ())


def _rebuild() -> None:
    raise ValueError("cannot rebuild")


class Echo(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.produce("echoed", {"user": ctx.key, "n": record.value["n"]})


def fixtures() -> list[Any]:
    good = [{"user": f"u{i % 3}", "n": i, "ts": 1_000 + i} for i in range(6)]
    return [*good[:2], {"n": 90, "ts": 1_090}, *good[2:4], Poison(user="u1", n=91, ts=1_091),
            {"user": "u2", "n": "not a number", "ts": 1_092}, *good[4:]]


def on_spark(spark: Any, tmp_path: Any, mode: str, on_error: str) -> tuple[set[Any], list[dict[str, Any]]]:
    t = Topology("intake")
    t.inject("events", injectors.records(fixtures(), timestamp="ts", batch_size=4))
    t.stream("events", schema=SCHEMA)
    t.add(Echo, inputs={"events": key_by("user")}, outputs=["echoed"], on_error=on_error)
    url = f"sqlite:///{tmp_path}/{mode}.db"
    run(t, store=url, spark=spark, progress=None, timeout_s=300, mode=mode)
    return outputs(read("echoed", url)), letters(read("Echo.dead_letter", url))


def outputs(records: Any) -> set[Any]:
    return {(r.value["user"], r.value["n"]) for r in records}


def letters(records: Any) -> list[dict[str, Any]]:
    """The dead letters, without the part that names where the run was (the same in every mode)."""
    return sorted(({k: v for k, v in r.value.items()} for r in records), key=lambda v: v["record_id"])


def on_the_harness(on_error: str) -> tuple[set[Any], list[dict[str, Any]]]:
    h = Harness(Echo, name="Echo", on_error=on_error, outputs=["echoed"], schemas={"events": SCHEMA})
    values = fixtures()
    for lo in range(0, len(values), 4):  # the injector's batches of 4
        h.inject("events", values[lo:lo + 4], key=key_by("user"), timestamp="ts")
    return outputs(h.productions("echoed")), letters(h.productions("Echo.dead_letter"))


def test_dead_letters_are_the_same_on_the_harness_and_in_both_modes(spark: Any, tmp_path: Any) -> None:
    harness = on_the_harness("dead_letter")
    micro = on_spark(spark, tmp_path, "microbatch", "dead_letter")
    continuous = on_spark(spark, tmp_path, "continuous", "dead_letter")
    assert harness == micro == continuous
    echoed, dead = harness
    assert echoed == {(f"u{i % 3}", i) for i in range(6)}
    assert [(d["record_id"], d["at"], d["error"].split(":")[0]) for d in dead] == [
        ("inject:events:1:2", "failed extracting its key with key_by('user')", "InvalidKeyError"),
        ("inject:events:2:1", "failed decoding it", "ValueError"),
        ("inject:events:2:2", "record 'inject:events:2:2' (timestamp 1092)", "SchemaMismatchError"),
    ]
    assert dead[0]["value"] == {"n": 90, "ts": 1_090}
    assert isinstance(dead[1]["value"], bytes)  # the stored value, which nothing can decode


def test_a_keying_error_is_the_same_error_in_every_runtime(spark: Any, tmp_path: Any) -> None:
    expected = ("Computation 'Echo' cannot take record 'inject:events:1:2' of stream 'events': failed extracting "
                "its key with key_by('user') (got InvalidKeyError: key_by('user') found no field 'user' in the record "
                "(got {'n': 90, 'ts': 1090}). Hint: check the field name, or pass a function: key_by(lambda v: "
                "...)). Hint: fix the record or the key extractor, or add the computation with "
                "on_error='dead_letter' to route such records aside")
    with pytest.raises(Exception, match=f"^{re.escape(expected)}$"):
        on_the_harness("fail")
    for mode in ("microbatch", "continuous"):
        with pytest.raises(UserCodeError, match=re.escape(f"headrace.errors.BadInputError: {expected}")):
            on_spark(spark, tmp_path, mode, "fail")
