"""The engine owns its ports: nothing under ``headrace/engine`` imports the stores or Spark, not even
for type checking (docs/architecture.md §7); and model, topology and engine import without pyspark."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import headrace.engine

ENGINE = Path(headrace.engine.__file__).parent


def imported_modules(path: Path) -> list[str]:
    """Every module a file imports, relative imports resolved against ``headrace.engine``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "headrace.engine" if node.level == 1 else "headrace" if node.level == 2 else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.extend([module] + [f"{module}.{alias.name}" for alias in node.names])
    return found


def test_no_engine_module_imports_a_store_or_spark() -> None:
    files = sorted(ENGINE.glob("*.py"))
    assert len(files) >= 8, files  # the check must see the engine's modules
    offending = {f.name: [m for m in imported_modules(f) if m.startswith(("headrace.store", "headrace.spark", "pyspark"))]
                 for f in files}
    assert {name: mods for name, mods in offending.items() if mods} == {}


def test_the_check_sees_a_store_import_even_under_type_checking(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..store.base import Store\n")
    assert "headrace.store.base.Store" in imported_modules(sample)


def test_model_topology_and_engine_import_without_pyspark() -> None:
    code = ("import sys; sys.modules['pyspark'] = None\n"  # any import of pyspark now fails
            "import headrace.model, headrace.topology, headrace.engine, headrace.engine.worker, headrace.testing\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
