"""Inspection never unpickles unless asked (docs/security.md): a crafted state, record or dead
letter whose unpickling would write a file is shown by its size by ``headrace state``, ``read``,
``dead-letters`` and the dashboard, and runs only under ``--unpickle``."""

from __future__ import annotations

import json
import pickle
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from headrace import Computation, Topology, cli, key_by
from headrace.codecs import Pickled, safe_loads
from headrace.dashboard import Dashboard
from headrace.monitor.graph import record_topology
from headrace.testing import Harness


class Tally(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value == "boom":
            raise ValueError("boom")
        ctx.state = {"n": (ctx.state or {"n": 0})["n"] + 1}
        ctx.produce("out", record.value)


class WritesAFile:
    """Unpickling it creates ``path``: what a store's writer could make any unpickler do."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def crafted(tmp_path: Path) -> tuple[Harness, Path, bytes]:
    h = Harness(Tally, on_error="dead_letter", outputs=["out"])
    h.process("a", "x", 10)
    h.process("b", "boom", 20)
    topology = Topology("t")
    topology.inject("in", [])
    topology.add(Tally, inputs={"in": key_by("k")}, outputs=["out"], on_error="dead_letter")
    record_topology(h.store, topology, "continuous",
                    {"in": ["inject:in"], "out": ["Tally"], "Tally.dead_letter": ["Tally"]})
    marker = tmp_path / "ran"
    evil = pickle.dumps(WritesAFile(marker))
    h.store._x("UPDATE state SET value = ? WHERE key = 'a'", (evil,))  # type: ignore[attr-defined]
    return h, marker, evil


def shown(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_headrace_state_shows_a_crafted_state_by_its_size_and_unpickles_it_only_with_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h, marker, evil = crafted(tmp_path)
    out = shown(capsys, "state", "Tally", "a", "--store", h.store.url)
    assert json.loads(out) == (f"<pickled, {len(evil)} bytes; pass --unpickle to decode it (unpickling runs code "
                               "the store's writer chose)>")
    assert not marker.exists()
    shown(capsys, "state", "Tally", "a", "--store", h.store.url, "--unpickle")
    assert marker.exists()  # the flag is what runs it


def test_read_and_dead_letters_decode_plain_data_and_never_run_a_crafted_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h, marker, evil = crafted(tmp_path)
    [letter] = [json.loads(line) for line in shown(capsys, "dead-letters", "Tally", "--store", h.store.url).splitlines()]
    assert (letter["value"]["key"], letter["value"]["error"]) == ("b", "ValueError: boom")  # plain data decodes
    # a crafted record on the bus: the stream "out" rewritten with the file writer as a value
    from headrace.engine.batch import Production
    from headrace.store.segments import encode_segment

    segment = encode_segment([Production("out", "a", WritesAFile(marker), 10, "r1")])
    h.store._x("UPDATE segments SET data = ? WHERE stream = 'out'", (segment,))  # type: ignore[attr-defined]
    [record] = [json.loads(line) for line in shown(capsys, "read", "out", "--store", h.store.url).splitlines()]
    assert record["value"].startswith("<pickled, ") and not marker.exists()
    shown(capsys, "read", "out", "--store", h.store.url, "--unpickle")
    assert marker.exists()


def test_the_dashboards_key_view_never_unpickles_unless_started_with_unpickle(tmp_path: Path) -> None:
    h, marker, evil = crafted(tmp_path)
    board = Dashboard(h.store.url).start()
    try:
        with urllib.request.urlopen(board.url + "api/key?computation=Tally&key=a", timeout=10) as response:
            body = json.loads(response.read())
        assert body["state"].startswith(f"<pickled, {len(evil)} bytes") and not marker.exists()
    finally:
        board.stop()
    board = Dashboard(h.store.url, unpickle=True).start()
    try:
        urllib.request.urlopen(board.url + "api/key?computation=Tally&key=a", timeout=10).close()
        assert marker.exists()
    finally:
        board.stop()


@pytest.mark.parametrize("value", [None, True, 3, 2.5, "s", b"b", bytearray(b"x"), [1, (2, 3)], {"a": {1, 2}},
                                   frozenset({1}), 1 + 2j])
def test_a_safe_decode_gives_plain_data_back_as_pickle_does(value: Any) -> None:
    assert safe_loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)) == value


def test_a_safe_decode_looks_up_no_class_or_function() -> None:
    assert safe_loads(pickle.dumps(Path("x"))) == Pickled(len(pickle.dumps(Path("x"))))
    assert isinstance(safe_loads(b"not a pickle"), Pickled)
