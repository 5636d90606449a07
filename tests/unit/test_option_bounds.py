"""Options that would lose data or pass a check they should fail: negative rate, max_delay_ms and count
(a negative delay puts the watermark ahead of the records and drops them as late), and names with a
trailing newline (``$`` matches before one)."""

from __future__ import annotations

from typing import Any

import pytest

from headrace import Topology, injectors
from headrace.errors import OptionError, TopologyError


@pytest.mark.parametrize("rate", [-1, 0, -0.5, True])
def test_a_rate_that_is_not_positive_is_refused(rate: Any) -> None:
    with pytest.raises(OptionError, match=r"An injector's rate must be a number of records per second > 0 \(got "
                                          + repr(rate).replace(".", r"\.") + r"\)\. Hint: e\.g\. rate=1000"):
        injectors.records([1], rate=rate)


@pytest.mark.parametrize("delay", [-1, -1000, 1.5])
def test_a_negative_max_delay_is_refused(delay: Any) -> None:
    with pytest.raises(OptionError, match=r"An injector's max_delay_ms must be an integer >= 0 \(got "
                                          + repr(delay).replace(".", r"\.") + r"\)"):
        injectors.generator(lambda i: i, 10, max_delay_ms=delay)


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(OptionError, match=r"generator\(\)'s count must be an integer >= 0, or None for forever "
                                          r"\(got -3\)\. Hint: e\.g\. count=1000"):
        injectors.generator(lambda i: i, -3)


def test_good_options_still_pass() -> None:
    assert injectors.generator(lambda i: i, 0, rate=10.5, max_delay_ms=0).max_delay_ms == 0


@pytest.mark.parametrize("name", ["words\n", "words\r", "wo\nrds"])
def test_a_name_with_a_newline_is_refused(name: str) -> None:
    with pytest.raises(TopologyError, match=r"name must be a short identifier"):
        Topology(name)


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2", True])
def test_a_number_of_workers_that_is_not_a_whole_number_of_at_least_one_is_refused_before_spark_starts(
        workers: Any) -> None:
    from headrace import run

    t = Topology("w")
    t.inject("s", [])
    with pytest.raises(OptionError, match=rf"workers must be a whole number of at least 1 \(got {workers!r}\)\. "
                                          r"Hint: the number of continuous workers"):
        run(t, store="sqlite:///unused.db", workers=workers, spark=object())


def test_workers_in_micro_batch_mode_is_refused_not_ignored() -> None:
    from headrace import run

    t = Topology("w")
    t.inject("s", [])
    with pytest.raises(OptionError, match=r"workers applies to continuous mode only \(got 2\)\. Hint: micro-batch "
                                          r"mode runs a Spark query per computation"):
        run(t, store="sqlite:///unused.db", mode="microbatch", workers=2, spark=object())
