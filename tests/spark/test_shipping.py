"""User code that only the driver has reaches the executors: ``run(py_files=...)`` ships files,
zips and package folders, and ``headrace run`` ships the topology's own package."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from headrace import Computation, Topology, injectors, key_by, read, run
from headrace.errors import OptionError
from headrace.spark.shipping import prepare_user_code, user_package


def a_package(root: Path) -> str:
    """A package in ``root`` (outside every path the Python workers search), with a unique name."""
    name = f"shipped_{uuid.uuid4().hex[:8]}"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "where.py").write_text("ANSWER = 42\n")
    return name


def imported_on_a_worker(spark: Any, module: str) -> tuple[int, str] | str:
    def probe(_: Any) -> Any:
        import importlib

        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            return [str(exc)]
        return [(found.ANSWER, found.__file__)]

    return spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()[0]  # type: ignore[no-any-return]


def test_a_shipped_package_folder_is_imported_on_the_python_workers_and_an_unshipped_one_is_not(
        spark: Any, tmp_path: Path) -> None:
    name = a_package(tmp_path / "user")
    assert imported_on_a_worker(spark, f"{name}.where") == f"No module named '{name}'"

    prepare_user_code(spark, Topology("shipping"), [str(tmp_path / "user" / name)])
    answer, origin = imported_on_a_worker(spark, f"{name}.where")
    assert answer == 42
    assert f"{name}.zip" in origin and str(tmp_path) not in origin, origin  # the shipped copy, not the folder


class ImportsItsPackage(Computation):
    """User code that imports, as it runs, a package only the driver has (the record names it)."""

    def process_record(self, ctx: Any, record: Any) -> None:
        import importlib

        ctx.produce("answers", importlib.import_module(record.value["module"]).ANSWER)


@pytest.mark.parametrize("mode", ["microbatch", "continuous"])
def test_a_computation_imports_a_shipped_package_as_it_runs_in_each_mode(spark: Any, tmp_path: Path,
                                                                          mode: str) -> None:
    """A micro-batch computation runs in its source's tasks, whose Python workers Spark starts
    without the shipped py-files on their path (unlike a UDF's): the task puts them there."""
    name = a_package(tmp_path / "user")
    t = Topology(f"shipping_{mode}")
    t.inject("events", injectors.records([{"module": f"{name}.where", "n": i} for i in range(6)],
                                         timestamp=lambda v: 1_000 + v["n"]))
    t.add(ImportsItsPackage, inputs={"events": key_by("n", int)}, outputs=["answers"], shards=2)
    url = f"sqlite:///{tmp_path}/store.db"
    run(t, store=url, spark=spark, progress=None, timeout_s=300, mode=mode, py_files=[str(tmp_path / "user" / name)])
    assert sorted(r.value for r in read("answers", url)) == [42] * 6


def test_user_package_names_the_top_level_folder_or_file_and_nothing_installed(tmp_path: Path) -> None:
    name = a_package(tmp_path)
    (tmp_path / f"{name}_single.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(f"{name}.where")
        __import__(f"{name}_single")
        assert user_package(f"{name}.where") == str(tmp_path / name)
        assert user_package(f"{name}_single") == str(tmp_path / f"{name}_single.py")
    finally:
        sys.path.remove(str(tmp_path))
    assert user_package("json") is None  # the standard library
    assert user_package("headrace.api") is None
    assert user_package("pandas") is None  # site-packages: the executors install their own


@pytest.mark.parametrize("path, message", [
    ("missing.py", "A py-file to ship to the executors does not exist (got 'MISSING'). "
                   "Hint: give a .py file, a .zip or .egg, or a package folder (one with __init__.py)"),
    ("folder", "A folder shipped to the executors must be a package (got 'MISSING'). "
               "Hint: add MISSING/__init__.py, or ship the package folders inside it"),
    ("notes.txt", "Spark ships only Python files, zips, eggs and package folders (got 'MISSING'). "
                  "Hint: zip the code, or name the package folder"),
])
def test_what_cannot_be_shipped_is_refused_before_anything_is_shipped(
        spark: Any, tmp_path: Path, path: str, message: str) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("")
    given = str(tmp_path / path)
    expected = re.escape(message).replace("MISSING", re.escape(given))
    with pytest.raises(OptionError, match=f"^{expected}$"):
        prepare_user_code(spark, Topology("shipping"), [given])
