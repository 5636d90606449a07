"""The SparkSession headrace runs on, configured for one task per key shard."""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["spark_session", "ui_url", "worker_python", "ui_bind_address"]

_LOCAL_MASTER = re.compile(r"local(\[[^\]]*\])?")

# Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
# worker's PYTHONPATH. Python compiles a zip's modules from source on each import, with no
# bytecode cache: a fresh process spends about 0.7 s importing pyspark from it where the
# installed package takes 0.25 s. Each streaming query starts such a process for its Python
# source, so every micro-batch run paid it (BENCHMARKS.md, "Monoid computations").
_LAUNCHER = """#!/bin/sh
# headrace: runs Spark's local Python workers on {python} with pyspark imported from its
# installed package (compiled once) instead of the zip Spark puts first on PYTHONPATH.
set -f  # the entries are paths, not patterns to expand
kept=""
old_ifs=$IFS; IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    {zips}) ;;
    *) kept="${{kept:+$kept:}}$entry" ;;
  esac
done
IFS=$old_ifs
PYTHONPATH=$kept; export PYTHONPATH
exec {python} "$@"
"""

_launcher_path: str | None = None


def worker_python(master: str) -> str | None:
    """The launcher Spark's Python workers should run for ``master``, or ``None`` to leave
    ``PYSPARK_PYTHON`` alone. Only a local master qualifies (its workers share this machine),
    with the workers on this very interpreter (``PYSPARK_PYTHON`` unset or naming it) and
    pyspark and py4j installed as packages here, so dropping Spark's zips of them from
    PYTHONPATH imports the same code. Elsewhere the zips are what the workers have."""
    if not _LOCAL_MASTER.fullmatch(master):
        return None
    chosen = os.environ.get("PYSPARK_PYTHON")
    if chosen and not _same_file(chosen, sys.executable):
        return None
    import py4j
    import pyspark

    if any(".zip" in (m.__file__ or ".zip") for m in (pyspark, py4j)):
        return None
    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    # Spark names its zips under its own home, which is the real path when the venv is reached
    # through a symlink (a worktree's link to a shared venv): both spellings are dropped
    zips = "|".join(f"{shlex.quote(d)}/pyspark.zip|{shlex.quote(d)}/py4j-*-src.zip"
                    for d in dict.fromkeys([lib, os.path.realpath(lib)]))
    return _write_launcher(_LAUNCHER.format(python=shlex.quote(sys.executable), zips=zips))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _write_launcher(text: str) -> str:
    """The launcher's path: written once per process, in a private folder removed at exit."""
    global _launcher_path
    if _launcher_path is None or not os.path.exists(_launcher_path):
        folder = tempfile.mkdtemp(prefix="headrace-python-")
        atexit.register(shutil.rmtree, folder, True)
        path = os.path.join(folder, "python")
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o700)
        _launcher_path = path
    return _launcher_path


def ui_bind_address(master: str) -> str | None:
    """What ``SPARK_LOCAL_IP`` a session this process creates for ``master`` should start with, or
    ``None`` to leave it alone. Spark's UI (Spark 4.3 too) binds to ``SPARK_LOCAL_IP``, or to every
    interface: anyone who reaches the machine could read the jobs and kill them. On a local master
    nothing outside this machine talks to the driver, so its UI (and driver) bind to loopback; a
    ``SPARK_LOCAL_IP`` of the user's own wins. On a cluster the executors must reach the driver,
    and Spark's own rules hold (docs/security.md)."""
    if not _LOCAL_MASTER.fullmatch(master) or os.environ.get("SPARK_LOCAL_IP"):
        return None
    return "127.0.0.1"


@contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """``name`` set to ``value`` (when not None) for the block only."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def spark_session(master: str = "local[*]", app_name: str = "headrace", conf: dict[str, str] | None = None,
                  ui: bool = True) -> Any:
    """Get (or create) the session; registers the ``headrace`` streaming source. ``ui=False``
    turns Spark's web UI off (it is on by default; ``ui_url(spark)`` says where).

    Python workers run ``PYSPARK_PYTHON``; it defaults to this interpreter so they find headrace.
    A session this call creates on a local master runs them through ``worker_python``'s launcher.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .source import HeadraceSource

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.ui.enabled", "true" if ui else "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.python.worker.reuse", "true")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "false"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    # SparkContext reads PYSPARK_PYTHON when it is created (a running one keeps its own); the
    # launcher is the workers' alone, so the variable goes back to what it was; the JVM it starts
    # reads SPARK_LOCAL_IP once, as it starts
    with _env("PYSPARK_PYTHON", worker_python(master)), _env("SPARK_LOCAL_IP", ui_bind_address(master)):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(HeadraceSource)
    return spark


def ui_url(spark: Any) -> str | None:
    """Where the session's Spark web UI listens (``None`` when it is off)."""
    return spark.sparkContext.uiWebUrl
