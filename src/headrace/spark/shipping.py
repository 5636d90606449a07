"""User code reaching the executors: the topology's classes and extractors are pickled by value,
and whole user modules or packages (what those classes import) are shipped as Spark py-files, so
a module that only the driver has still runs on a cluster."""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Sequence, TextIO

from ..errors import OptionError
from ..topology import Topology

__all__ = ["prepare_user_code", "user_package", "shipped_files", "put_shipped_on_path"]


def _installed(path: str) -> bool:
    """A module the executors get from their own installation (stdlib, site-packages, headrace)."""
    paths = sysconfig.get_paths()
    return ("site-packages" in path or "dist-packages" in path
            or path.startswith((paths["stdlib"], paths["platstdlib"])))


def user_package(module_name: str) -> str | None:
    """What to ship for ``module_name``: the folder of its top-level package, or the file of a
    top-level module; ``None`` for an installed module (the executors have their own copy)."""
    top = sys.modules.get(module_name.split(".")[0])
    path = getattr(top, "__file__", None)
    if top is None or not path or top.__name__ == "headrace" or _installed(path):
        return None
    return str(Path(path).parent) if Path(path).name == "__init__.py" else path


def _zipped(package: Path, into: Path) -> str:
    """A zip holding ``package`` as its top-level folder (what Python imports from a py-file)."""
    target = into / f"{package.name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for root, dirs, files in os.walk(package):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if not name.endswith((".pyc", ".pyo")):
                    full = Path(root) / name
                    z.write(full, full.relative_to(package.parent))
    return str(target)


def _ship(spark: Any, paths: Sequence[str]) -> list[str]:
    shipped: list[str] = []
    staging = Path(tempfile.mkdtemp(prefix="headrace-py-files-"))
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise OptionError("A py-file to ship to the executors does not exist", got=given,
                              hint="give a .py file, a .zip or .egg, or a package folder (one with __init__.py)")
        if path.is_dir():
            if not (path / "__init__.py").exists():
                raise OptionError("A folder shipped to the executors must be a package", got=given,
                                  hint=f"add {path / '__init__.py'}, or ship the package folders inside it")
            shipped.append(_zipped(path.resolve(), staging))
        elif path.suffix in (".py", ".zip", ".egg"):
            shipped.append(str(path.resolve()))
        else:
            raise OptionError("Spark ships only Python files, zips, eggs and package folders", got=given,
                              hint="zip the code, or name the package folder")
    for file in shipped:  # only once every path is known good
        spark.sparkContext.addPyFile(file)
    return shipped


def _pickle_by_value(topology: Topology) -> None:
    """Ship user classes and extractors to Python workers by value, not by an import they may lack."""
    from pyspark import cloudpickle

    # the modules of a class's bases too: a computation may build on a class of another module
    modules = {c.__module__ for spec in topology.computations.values() for c in spec.cls.__mro__}
    modules |= {getattr(getattr(e, "_fn", None), "__module__", None) or "headrace"
                for spec in topology.computations.values() for e in spec.inputs.values()}
    for name in modules:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) or ""
        if module is None or name.startswith("headrace") or not path or _installed(path) or name == "__main__":
            continue
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:
            pass


def prepare_user_code(spark: Any, topology: Topology, py_files: Sequence[str] = (),
                      progress: TextIO | None = None) -> None:
    """Before any job: ship ``py_files`` (files, zips, package folders) to every executor, and pickle
    the topology's own classes by value."""
    for path in _ship(spark, py_files):
        if progress is not None:
            print(f"headrace: shipped {path} to the executors", file=progress, flush=True)
    _pickle_by_value(topology)


def shipped_files(spark: Any) -> tuple[str, ...]:
    """The names of the py-files shipped to the executors so far (in each one's SparkFiles folder)."""
    return tuple(spark.sparkContext._python_includes or ())


def put_shipped_on_path(names: Sequence[str]) -> None:
    """Put the shipped py-files on this Python worker's path, as PySpark does for a UDF's worker: the
    worker that runs a Python data source's read gets none of them, so the user package a
    computation imports would not be found there."""
    from pyspark import SparkFiles
    from pyspark.worker_util import add_path  # what a UDF's worker puts them on its path with

    try:
        root = SparkFiles.getRootDirectory()
    except Exception:  # not a worker that Spark set up (a test calling the source directly)
        return
    for path in (root, *(os.path.join(root, name) for name in names)):
        add_path(path)
