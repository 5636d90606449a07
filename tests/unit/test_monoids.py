"""headrace/monoids.py: the ready-made hooks behave exactly like the methods they stand in for,
and refuse what they cannot be."""

from __future__ import annotations

import pytest

from headrace.errors import BadInputError, OptionError
from headrace.model import Record
from headrace.monoids import Tumbling, constant, field, tumbling


def test_each_hook_gives_what_its_hand_written_method_gives() -> None:
    record = Record("k", {"n": 7, "user": "ada"}, 12_345, "r1")
    assert field("n")(record) == record.value["n"] == 7
    assert constant(1)(record) == 1
    assert tumbling(10_000)(record) == 20_000  # the end of [10 000, 20 000)
    assert tumbling(10_000)(Record("k", {}, 20_000, "r2")) == 30_000  # the end is exclusive
    assert tumbling(1_000)(Record("k", {}, -1, "r3")) == 0  # floor windows before the epoch too
    assert (repr(field("n")), repr(constant(1)), repr(tumbling(5))) == ("field('n')", "constant(1)", "tumbling(5)")


def test_a_record_without_the_field_is_named_with_a_hint() -> None:
    with pytest.raises(BadInputError, match=r"^field\('n'\) found no field 'n' in the record's value \(got \{'m': 1\}\)\. "
                                            r"Hint: check the field name, or write lift\(self, record\) yourself$"):
        field("n")(Record("k", {"m": 1}, 0, "r9"))


@pytest.mark.parametrize("size", [0, -5, 1.5, "10"])
def test_a_window_length_must_be_a_positive_int(size: object) -> None:
    with pytest.raises(OptionError, match=r"^tumbling\(size\) takes a window length in milliseconds, a positive int "
                                          rf"\(got {size!r}\)\. Hint: e\.g\. window = tumbling\(60_000\)"):
        tumbling(size)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"^tumbling\(size\) takes a window length"):
        Tumbling(size)  # type: ignore[arg-type]  # built directly, the same check


def test_a_field_needs_a_name() -> None:
    with pytest.raises(OptionError, match=r"^field\(name\) takes the name of a field of the records' values \(got ''\)"):
        field("")
