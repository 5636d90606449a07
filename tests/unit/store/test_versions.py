"""The store's schema version, checked at open (store/versions.py), and read-only access for the
tools that only look: on both stores, a store another headrace made fails at open with
what/got/hint; a read-only open writes nothing, works on a read-only file, and a mistyped path is
an error naming it, not a new empty store."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

from headrace import cli
from headrace.errors import StoreError
from headrace.names import meta
from headrace.store import open_store
from headrace.store.versions import SCHEMA_VERSION
from headrace.testing import Harness
from headrace import Computation


class Count(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1


def shown(url: str) -> str:
    return open_store(url).shown_url


def test_a_new_store_records_its_schema_version(each_store: str) -> None:
    db = open_store(each_store)
    assert db.get_meta(meta.SCHEMA_VERSION) == str(SCHEMA_VERSION) == "1"
    db.close()


def test_a_store_a_newer_headrace_made_fails_at_open_saying_so(each_store: str) -> None:
    db = open_store(each_store)
    db.put_meta(meta.SCHEMA_VERSION, "99")
    where = db.shown_url
    db.close()
    message = re.escape(f"The store at {where} was made by a newer headrace (schema version 99; this headrace reads "
                        "version 1) (got 99). Hint: run the headrace release that made it (or a newer one), or point "
                        "--store at another store")
    for read_only in (False, True):
        with pytest.raises(StoreError, match=message):
            open_store(each_store, read_only=read_only)


def test_a_store_an_older_headrace_made_fails_at_open_naming_what_it_lacks(each_store: str) -> None:
    db = open_store(each_store)
    db.delete_meta(meta.SCHEMA_VERSION)  # made before versions were recorded, and before computations had a mode
    db._x("ALTER TABLE computations DROP COLUMN mode")  # type: ignore[attr-defined]
    where = db.shown_url
    db.close()
    message = re.escape(f"The store at {where} was made by an older headrace (schema version 0; this headrace reads "
                        "version 1: table computations lacks mode) (got 0). Hint: finish its work with the headrace "
                        "release that made it and start this one on a new store (its outputs stay readable with that "
                        "release); there is no in-place migration yet")
    for read_only in (False, True):
        with pytest.raises(StoreError, match=message):
            open_store(each_store, read_only=read_only)


def test_a_store_from_before_versions_with_every_column_is_adopted(each_store: str) -> None:
    db = open_store(each_store)
    db.delete_meta(meta.SCHEMA_VERSION)
    db.close()
    open_store(each_store, read_only=True).close()  # readable as it is, and left as it is
    db = open_store(each_store)
    assert db.get_meta(meta.SCHEMA_VERSION) == "1"
    db.close()


def test_a_read_only_open_writes_nothing(each_store: str) -> None:
    Harness(Count, store=each_store).process("k", 1, 10)
    db = open_store(each_store, read_only=True)
    try:
        with pytest.raises(Exception, match="read-only|readonly"):
            db.put_meta("x", "y")
        assert list(db.computations()) == ["Count"]
    finally:
        db.close()


def test_a_read_only_open_of_a_database_without_a_store_creates_nothing(each_store: str) -> None:
    if each_store.startswith("sqlite"):  # an empty file
        Path(each_store[len("sqlite:///"):]).touch()
    with pytest.raises(StoreError, match=re.escape(
            f"{shown_without_creating(each_store)} is not a headrace store (it has no headrace tables) (got "
            f"'{shown_without_creating(each_store)}'). Hint: check --store: a run creates its store, the tools only "
            "read one")):
        open_store(each_store, read_only=True)
    db = open_store(each_store)  # still nothing in it: this open makes the store
    assert db.computations() == {}
    db.close()


def shown_without_creating(url: str) -> str:
    from headrace.store.redact import redact_url
    return redact_url(url)


TOOLS: list[tuple[str, ...]] = [("status",), ("read", "out"), ("state", "Count", "k"), ("dead-letters", "Count"),
                                ("watermarks",)]


@pytest.mark.parametrize("tool", TOOLS, ids=[t[0] for t in TOOLS])
def test_a_tool_on_a_mistyped_path_names_it_and_creates_nothing(tool: tuple[str, ...], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "typo" / "store.db"
    assert cli.main([*tool, "--store", f"sqlite:///{path}"]) == 2
    assert capsys.readouterr().err == (
        f"headrace: No store at {path} (got 'sqlite:///{path}'). Hint: check --store (sqlite:///relative/file.db or "
        "sqlite:////absolute/file.db): a run creates its store, the tools only read one\n")
    assert not (tmp_path / "typo").exists()


def as_nobody(work: Callable[[], int]) -> int:
    """``work()``'s result, run in a child process without root's power to write any file (as
    ``nobody``), when this process is root; else here."""
    if os.geteuid() != 0:
        return work()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            code = work()
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    result = os.read(read, 1)
    os.waitpid(pid, 0)
    return result[0]


def test_the_tools_work_on_a_read_only_file_in_a_read_only_folder(tmp_path: Path) -> None:
    made = tmp_path / "made.db"
    h = Harness(Count, store=f"sqlite:///{made}")
    h.process("k", 1, 10)
    h.store.close()
    outer = Path(tempfile.mkdtemp())  # outside pytest's folder, which only its owner may enter
    outer.chmod(0o755)
    folder = outer / "ro"
    folder.mkdir()
    shutil.copy(made, folder / "store.db")
    (folder / "store.db").chmod(0o444)
    folder.chmod(0o555)
    before = (folder / "store.db").read_bytes()
    url = f"sqlite:///{folder / 'store.db'}"
    import headrace.api  # noqa: F401  (loaded before a child drops root: it may not read root's files)
    import headrace.monitor  # noqa: F401

    def look() -> int:
        with open(os.devnull, "w") as quiet:
            sys.stdout = quiet
            try:
                return max(cli.main(["status", "--store", url]), cli.main(["timers", "Count", "k", "--store", url]))
            finally:
                sys.stdout = sys.__stdout__
    try:
        assert as_nobody(look) == 0
        assert (folder / "store.db").read_bytes() == before and os.listdir(folder) == ["store.db"]
    finally:
        folder.chmod(0o755)
        shutil.rmtree(outer)


def test_the_read_only_tools_answer_on_both_stores(each_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    Harness(Count, store=each_store).process("k", 1, 10)
    for tool in (["status", "--json"], ["watermarks"], ["timers", "Count", "k"]):
        code = cli.main([*tool, "--store", each_store])
        assert (code, capsys.readouterr().err) == (0, "")
