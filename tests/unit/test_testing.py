"""testing.py: the harness takes a batch of records as one commit, with the same outcome as one by one."""

from __future__ import annotations

from typing import Any

import pytest

from headrace import Computation
from headrace.errors import BadInputError, InvalidKeyError, OptionError
from headrace.model import END_OF_TIME
from headrace.testing import Harness


class Running(Computation):
    """A running total and the order each key saw its values in, flushed by a watermark timer."""

    def process_record(self, ctx: Any, record: Any) -> None:
        total, seen = ctx.state or (0, [])
        ctx.state = (total + record.value, [*seen, record.value])
        ctx.set_timer("flush", record.timestamp - record.timestamp % 100 + 100)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("totals", {"key": ctx.key, "at": timer.timestamp, "state": ctx.state})


RECORDS = [(f"k{i % 7}", i, 1_000 + 13 * i) for i in range(300)]


def test_a_batch_ends_where_the_same_records_one_by_one_end() -> None:
    one_by_one, batched = Harness(Running, shards=2), Harness(Running, shards=2)
    for key, value, ts in RECORDS:
        one_by_one.process(key, value, ts)
    for at in range(0, len(RECORDS), 64):
        batched.process_batch(RECORDS[at:at + 64])
    for h in (one_by_one, batched):
        h.advance_watermark(END_OF_TIME)
    assert {f"k{k}": batched.state(f"k{k}") for k in range(7)} == {f"k{k}": one_by_one.state(f"k{k}") for k in range(7)}
    assert batched.state("k3")[1] == [v for k, v, _ in RECORDS if k == "k3"]  # each key's records in their order
    assert sorted(map(repr, (r.value for r in batched.productions("totals")))) == \
        sorted(map(repr, (r.value for r in one_by_one.productions("totals"))))
    assert batched.counters["records"] == one_by_one.counters["records"] == len(RECORDS)
    # a batch per call: five input batches and the watermark's, against one a record and the watermark's
    assert [len(h.store.batches(h.name)) for h in (batched, one_by_one)] == [6, len(RECORDS) + 1]


def test_a_poison_record_in_a_batch_is_dead_lettered_and_the_rest_of_the_batch_commits() -> None:
    h = Harness(Running, on_error="dead_letter")
    h.process_batch([("a", 1, 10), ("b\udc80", 2, 11, "bad-1"), ("a", 3, 12)])
    [dead] = h.productions("Running.dead_letter")
    assert dead.value["record_id"] == "bad-1" and dead.value["key"] == "b\udc80"
    assert h.state("a") == (4, [1, 3])


def test_under_on_error_fail_a_poison_record_stops_its_batch_before_anything_runs() -> None:
    h = Harness(Running)
    with pytest.raises(BadInputError, match=r"^Computation 'Running' cannot take record 'bad-1' of stream 'input' "
                                            r"under key 'b\\udc80' \(got its key 'b\\udc80' holds a lone surrogate"):
        h.process_batch([("a", 1, 10), ("b\udc80", 2, 11, "bad-1")])
    assert h.state("a") is None and h.counters.get("records", 0) == 0


def test_a_record_of_the_wrong_shape_is_refused_naming_it() -> None:
    h = Harness(Running)
    with pytest.raises(OptionError, match=r"^A harness record is \(key, value, timestamp\) or \(key, value, timestamp, "
                                          r"id\) \(got \('a', 1\)\)"):
        h.process_batch([("a", 1, 10), ("a", 1)])  # type: ignore[list-item]
    assert h.state("a") is None


def test_the_harness_docstring_examples_run() -> None:
    """pytest collects doctests from Markdown only (pyproject.toml): the module's are run here."""
    import doctest

    import headrace.testing

    result = doctest.testmod(headrace.testing)
    assert result.failed == 0 and result.attempted >= 10, result


def test_a_key_that_is_not_a_string_is_refused_naming_it() -> None:
    h = Harness(Running)
    with pytest.raises(InvalidKeyError, match=r"^A harness record needs a str key \(got 7 of type int\)"):
        h.process_batch([("a", 1, 10), (7, 2, 11)])  # type: ignore[list-item]
    assert h.state("a") is None
