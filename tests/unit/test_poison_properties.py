"""Property (issue 23): whatever values, keys and timestamps reach the Harness or the files
injector under on_error="dead_letter", every batch commits and nothing is lost: each input is in
the output or in the dead letters."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from headrace import Computation, injectors, read
from headrace.engine.publish import publish_injected
from headrace.engine.routing import EMPTY_PLAN
from headrace.errors import UnknownStreamError
from headrace.names import dead_letter_stream, injector
from headrace.store import open_store
from headrace.testing import Harness

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=8)  # lone surrogates included
ANY_INT = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.integers(0, 2 ** 41))
JSONISH = st.recursive(st.none() | st.booleans() | ANY_INT | st.floats() | ANY_TEXT,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
                       max_leaves=6)
UNPICKLABLE = st.sampled_from([threading.Lock, lambda: (lambda: 1), lambda: (i for i in range(2))]).map(lambda f: f())
VALUES = st.one_of(JSONISH, UNPICKLABLE)


class Echo(Computation):
    """Hands the store whatever came in: the value, under a key and at a time taken from it."""

    def process_record(self, ctx: Any, record: Any) -> None:
        value = record.value
        ctx.state = [(ctx.state or [0])[0] + 1, value]  # the state holds it too
        key = value.get("key") if isinstance(value, dict) else record.key
        stamp = value.get("at") if isinstance(value, dict) and isinstance(value.get("at"), int) else None
        ctx.produce("out", {"id": record.id, "value": value}, timestamp=stamp, key=key)
        ctx.set_timer("t", stamp if stamp is not None else record.timestamp)

    def process_timer(self, ctx: Any, timer: Any) -> None:
        ctx.produce("fired", timer.timestamp)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(ANY_TEXT, st.one_of(VALUES, st.fixed_dictionaries({"key": VALUES, "at": ANY_INT})), ANY_INT),
                min_size=1, max_size=6))
def test_the_harness_commits_every_batch_and_loses_no_input(inputs: list[tuple[str, Any, int]]) -> None:
    h = Harness(Echo, on_error="dead_letter", late="deliver")
    for n, (key, value, stamp) in enumerate(inputs):
        h.process(key, value, stamp, id=f"r{n}")  # raises if the batch cannot commit
    h.advance_watermark(2 ** 62)
    out = {r.value["id"] for r in h.productions("out")}
    dead = {r.value["record_id"] for r in h.productions("Echo.dead_letter")}
    assert out | dead == {f"r{n}" for n in range(len(inputs))} and not out & dead
    assert h.counters.get("records", 0) + h.counters.get("dead_lettered", 0) >= len(inputs)


LINES = st.one_of(
    st.fixed_dictionaries({"ts": ANY_INT, "v": JSONISH}).map(lambda d: json.dumps(d).encode()),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=12).filter(lambda b: b"\n" not in b),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(st.sampled_from(["a/1.jsonl", "b/1.jsonl", "a/2.jsonl"]), st.lists(LINES, max_size=6),
                             min_size=1))
def test_the_files_injector_publishes_every_line_once_as_a_record_or_a_dead_letter(
        tmp_path_factory: Any, files: dict[str, list[bytes]]) -> None:
    root = tmp_path_factory.mktemp("files")
    folder = root / "in"
    expected: list[str] = []
    for name, lines in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"".join(line + b"\n" for line in lines))
        expected += [f"{name}:{n}" for n in range(sum(1 for line in lines if line.strip()))]  # ids count records
    url = f"sqlite:///{root}/bus.db"
    store = open_store(url)
    producer = injector("s")
    inj = injectors.files(str(folder), timestamp="ts", pattern="*/*.jsonl", bounded=True, clock=lambda: 1_000)
    for batch, got in enumerate(inj.batches(None), 1):  # each publish commits, or this raises
        publish_injected(store, producer, batch, "s", got.records, got.watermark, got.checkpoint, None, EMPTY_PLAN,
                         batch, got.dead_letters)
    store.close()
    published = [r.id for r in _read("s", url)]
    dead = _read(dead_letter_stream("s"), url)
    assert sorted(published + [r.id for r in dead]) == sorted(expected)  # each line once: injected or dead-lettered
    for r in dead:  # and a dead letter names its file and line
        assert files[r.value["file"]][r.value["line"] - 1] == r.value["text"]


def _read(stream: str, url: str) -> list[Any]:
    try:
        return list(read(stream, url))
    except UnknownStreamError:  # nothing was ever written to it
        return []
