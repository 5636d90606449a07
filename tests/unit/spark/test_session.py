"""spark/session.py: the launcher local Python workers run, so they import the installed pyspark
rather than compiling Spark's zip of it in every new process; no SparkSession needed."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pyspark
import pytest

from headrace.spark import session
from headrace.spark.session import worker_python

LIB = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
SPARK_ZIPS = [os.path.join(LIB, "pyspark.zip"), *glob.glob(os.path.join(LIB, "py4j-*-src.zip"))]


def run_launcher(launcher: str, pythonpath: str) -> list[str]:
    """What a worker started through ``launcher`` sees: its PYTHONPATH, and where pyspark came from."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run([launcher, "-c", "import os, pyspark; print(os.environ.get('PYTHONPATH', '')); "
                                          "print(pyspark.__file__)"],
                         env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    return out


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4, 3]"])
def test_a_local_master_on_this_interpreter_gets_the_launcher(master: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    launcher = worker_python(master)
    assert launcher is not None and os.access(launcher, os.X_OK)
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert worker_python(master) == launcher  # written once per process


@pytest.mark.parametrize("master", ["spark://host:7077", "yarn", "k8s://https://api:6443", "local-cluster[2,1,1024]"])
def test_a_cluster_master_keeps_spark_python_as_it_is(master: str) -> None:
    assert worker_python(master) is None  # its executors may have no such file


def test_another_interpreter_chosen_by_the_user_is_left_alone(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    other = tmp_path / "python3"
    other.write_text("#!/bin/sh\nexec python3 \"$@\"\n")
    monkeypatch.setenv("PYSPARK_PYTHON", str(other))
    assert worker_python("local[2]") is None


def test_pyspark_imported_from_a_zip_keeps_the_zips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspark, "__file__", os.path.join(LIB, "pyspark.zip", "pyspark", "__init__.py"))
    assert worker_python("local[2]") is None  # then the zip is all the workers have


def test_the_launcher_drops_only_sparks_zips_and_runs_this_interpreter(tmp_path) -> None:
    launcher = worker_python("local[2]")
    assert launcher is not None
    kept = ["/opt/jobs/spark-core_2.13-4.3.0.jar", str(tmp_path / "with space"), str(tmp_path / "*.egg")]
    path, origin = run_launcher(launcher, ":".join([*SPARK_ZIPS, *kept]))
    assert path.split(":") == kept  # in order; a '*' in an entry is a path, not a pattern
    assert origin == pyspark.__file__ and ".zip" not in origin


def test_through_the_zips_the_same_import_comes_from_the_zip() -> None:
    """The baseline the launcher avoids: the interpreter itself, given Spark's PYTHONPATH."""
    out = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
                         env={**os.environ, "PYTHONPATH": ":".join(SPARK_ZIPS)}, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out.startswith(os.path.join(LIB, "pyspark.zip"))


def test_the_variable_is_set_for_the_sessions_creation_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    with session._env("PYSPARK_PYTHON", "/tmp/launcher"):
        assert os.environ["PYSPARK_PYTHON"] == "/tmp/launcher"
    assert os.environ["PYSPARK_PYTHON"] == "/usr/bin/python3"
    monkeypatch.delenv("PYSPARK_PYTHON")
    with session._env("PYSPARK_PYTHON", "/tmp/launcher"):
        pass
    assert "PYSPARK_PYTHON" not in os.environ


@pytest.mark.parametrize("master, own, expected", [
    ("local[2]", None, "127.0.0.1"), ("local", None, "127.0.0.1"), ("local[*]", "", "127.0.0.1"),
    ("local[2]", "0.0.0.0", None),  # the user's own SPARK_LOCAL_IP wins
    ("spark://cluster:7077", None, None),  # executors elsewhere must reach the driver: Spark's own rules
])
def test_the_ui_of_a_local_session_binds_to_loopback_unless_the_user_chose(
        master: str, own: str | None, expected: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if own is None:
        monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    else:
        monkeypatch.setenv("SPARK_LOCAL_IP", own)
    assert session.ui_bind_address(master) == expected


def test_the_launcher_drops_the_zips_named_by_their_real_path_too(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv reached through a symlink (a worktree's link to a shared one): Spark's home, and so
    the paths of the zips it puts on PYTHONPATH, are the real ones."""
    link = tmp_path / "linked-pyspark"
    link.symlink_to(os.path.dirname(os.path.realpath(pyspark.__file__)))
    monkeypatch.setattr(pyspark, "__file__", str(link / "__init__.py"))
    monkeypatch.setattr(session, "_launcher_path", None)
    launcher = worker_python("local[2]")
    assert launcher is not None
    real = [os.path.realpath(z) for z in SPARK_ZIPS]
    linked = [os.path.join(link, "python", "lib", os.path.basename(z)) for z in SPARK_ZIPS]
    path, _ = run_launcher(launcher, ":".join([*real, *linked, "/opt/kept"]))
    assert path == "/opt/kept"
