from __future__ import annotations

import importlib
import re
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by, read, run, status
from headrace.errors import MISSING_MODULE_HINT, OptionError, UserCodeError
from headrace.store import open_store

EVENTS = [{"user": f"u{i % 7}", "n": i, "ts": 1_000 + i} for i in range(200)]
POISON = {"n": -1, "ts": 1_050}  # no "user": the key extractor raises on it


class CountPerUser(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("end", 10_000)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("counts", {"user": ctx.key, "n": ctx.state})


class Picky(CountPerUser):
    """Raises on one record; the fixed version (CountPerUser) does not."""

    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value["n"] == 77:
            raise ValueError("cannot handle 77")
        super().process_record(ctx, record)


def topology(cls: type[Computation], events: list[dict[str, Any]], **options: Any) -> Topology:
    t = Topology("bad_input")
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=50))
    t.add(cls, name="Counter", inputs={"events": key_by(lambda v: v["user"])}, outputs=["counts"], **options)
    return t


def counts(store_url: str) -> dict[str, int]:
    return {r.value["user"]: r.value["n"] for r in read("counts", store_url)}


def expected(events: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(e["user"] for e in events if "user" in e))


def test_a_record_whose_key_cannot_be_extracted_fails_the_run_naming_it_then_resumes_after_the_fix(
        spark: Any, store_url: str, mode: str) -> None:
    events = EVENTS[:50] + [POISON] + EVENTS[50:]
    with pytest.raises(UserCodeError, match=re.escape(
            "headrace.errors.BadInputError: Computation 'Counter' cannot take record 'inject:events:2:0' "
            "of stream 'events': failed extracting its key with key_by(") ) as failure:
        run(topology(CountPerUser, events), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    assert "KeyError: 'user'" in str(failure.value)
    assert ("The query of computation 'Counter' failed" if mode == "microbatch"
            else "A continuous worker failed") in str(failure.value)
    assert list(read("counts", store_url)) == []

    def fixed_extractor(v: dict[str, Any]) -> str:
        return v.get("user", "anonymous")

    t = Topology("bad_input")
    t.inject("events", injectors.records(events, timestamp="ts", batch_size=50))
    t.add(CountPerUser, name="Counter", inputs={"events": key_by(fixed_extractor)}, outputs=["counts"])
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    assert counts(store_url) == {**expected(EVENTS), "anonymous": 1}


def test_dead_letter_policy_routes_bad_records_aside_and_processes_the_rest(spark: Any, store_url: str, mode: str) -> None:
    events = EVENTS[:30] + [POISON] + EVENTS[30:]
    run(topology(Picky, events, on_error="dead_letter"), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    letters = sorted((r.value["record_id"], r.value["error"]) for r in read("Counter.dead_letter", store_url))
    assert len(letters) == 2
    assert letters[0][1] == "KeyError: 'user'"
    assert letters[1][1] == "ValueError: cannot handle 77"
    survivors = [e for e in EVENTS if e["n"] != 77]
    assert counts(store_url) == expected(survivors)
    assert open_store(store_url).counters("Counter")["dead_lettered"] == 2


def test_user_code_that_raises_fails_naming_computation_key_and_record_and_nothing_is_lost(
        spark: Any, store_url: str, mode: str) -> None:
    with pytest.raises(UserCodeError) as failure:
        run(topology(Picky, EVENTS), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    message = str(failure.value)
    assert re.search(r"UserCodeError: Computation 'Counter' failed on key 'u0' at record "
                     r"'inject:events:2:27' \(timestamp 1077\) \(got ValueError: cannot handle 77\)", message), message
    last_error = status(store_url)["stages"]["Counter"]["last_error"]  # kept in the store for `headrace status`
    assert (last_error["type"], last_error["message"]) == ("UserCodeError", message)
    run(topology(CountPerUser, EVENTS), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    assert counts(store_url) == expected(EVENTS)
    assert open_store(store_url).counters("Counter")["records"] == len(EVENTS)


@pytest.mark.parametrize("bad, message", [
    ({"user": "u1", "n": 5}, "Injected record has no timestamp field 'ts' (got {'user': 'u1', 'n': 5}). "
                             "Hint: fix the record, or pass timestamp=<field name or function>"),
    ({"user": "u1", "n": 5, "ts": 1_700_000_000_000_000}, "Injected record has an absurd timestamp "
     "(got 1700000000000000 in {'user': 'u1', 'n': 5, 'ts': 1700000000000000}). Hint: timestamps are integer "
     "milliseconds since the Unix epoch (1970 to 9999): were these seconds, microseconds or nanoseconds?"),
])
def test_an_injected_record_with_a_missing_or_absurd_timestamp_stops_the_run_naming_it(
        spark: Any, store_url: str, bad: dict[str, Any], message: str, mode: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        run(topology(CountPerUser, EVENTS[:10] + [bad]), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    assert list(read("events", store_url)) == []  # the whole (exact-watermark) list is checked before anything is published


def test_a_value_the_workers_cannot_unpickle_stops_the_run_naming_it_and_shipping_its_module_mends_it(
        spark: Any, store_url: str, mode: str, tmp_path: Path) -> None:
    module = f"private_{uuid.uuid4().hex[:8]}"  # only the driver can import it, from tmp_path
    (tmp_path / f"{module}.py").write_text("class Point:\n    def __init__(self, x):\n        self.x = x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        point = importlib.import_module(module).Point
        events = [{"user": f"u{i % 7}", "n": i, "ts": 1_000 + i, "at": point(i)} for i in range(200)]
        with pytest.raises(UserCodeError) as failure:
            run(topology(CountPerUser, events), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
        taken = r"cannot take record 'inject:events:\d+:\d+' of stream 'events': failed decoding it"  # either mode
        assert re.search(f"headrace.errors.BadInputError: Computation 'Counter' {taken} "
                         rf"\(got ModuleNotFoundError: No module named '{module}'\)\. Hint: {re.escape(MISSING_MODULE_HINT)}",
                         str(failure.value)), str(failure.value)
        assert list(read("counts", store_url)) == []

        run(topology(CountPerUser, events), store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode,
            py_files=[str(tmp_path / f"{module}.py")])
        assert counts(store_url) == expected(events)
    finally:
        sys.path.remove(str(tmp_path))
