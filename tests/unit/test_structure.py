"""Facts about the package's structure that a reviewer can check (docs/architecture.md §7): no
import cycle under src/headrace, the engine independent of the store and of Spark, the no-Spark
modules importable without pyspark, modules under 450 lines, no code repeated between the two
runtimes, and mypy over every module.

Tests marked ``xfail(strict=True)`` fail today for a reason issue 20 removes: once it does, they
pass, strict xfail reports that as a failure, and the mark goes.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "headrace"
MAX_LINES = 450

# the modules only one runtime uses (update when they move: a missing one fails the test)
MICRO_BATCH = ("headrace/spark/runner.py", "headrace/spark/query.py", "headrace/spark/source.py")
CONTINUOUS = ("headrace/spark/continuous.py", "headrace/engine/worker.py")
# what must import without pyspark (docs/architecture.md §7)
NO_SPARK = ("headrace.model", "headrace.topology", "headrace.engine", "headrace.store", "headrace.monitor",
            "headrace.testing")

INJECTORS_REFACTOR = ("injectors/__init__.py imports .backfill at its end and backfill imports the package "
                      "back; injectors/ is being restructured (the Kafka work of issue 20's wave)")


def modules() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package)}`` for every module under src/headrace."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _runtime_nodes(tree: ast.AST, with_type_only: bool) -> Iterator[ast.AST]:
    """Every node, at module level and inside functions, except under ``if TYPE_CHECKING:``
    (unless ``with_type_only``)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not with_type_only and isinstance(node, ast.If) and ast.unparse(node.test) in (
                "TYPE_CHECKING", "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(with_type_only: bool = False) -> dict[str, set[str]]:
    """``{module: the headrace modules it imports}``. ``from package import name`` counts as an
    import of the submodule ``package.name`` when there is one, else of the package."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        found: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path)), with_type_only):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in known:
                        target = target.rpartition(".")[0]
                    if target:
                        found.add(target)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base in known:
                    found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
        graph[name] = found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_import_walk_sees_module_level_function_level_and_relative_imports() -> None:
    graph = imports()
    assert "headrace.store.sqlite" in graph["headrace.store"]  # from .sqlite import ... in a package
    assert "headrace.spark.runner" in graph["headrace.api"]  # an import inside run()
    assert "headrace.injectors" in graph["headrace.injectors.backfill"]  # from . import ...
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import headrace.store.sql\n"
    tree = ast.parse(source)
    assert not any(isinstance(n, ast.Import) for n in _runtime_nodes(tree, with_type_only=False))
    assert any(isinstance(n, ast.Import) for n in _runtime_nodes(tree, with_type_only=True))
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.xfail(strict=True, reason=INJECTORS_REFACTOR)
def test_no_import_cycle_under_src() -> None:
    assert cycles(imports()) == []


def test_no_import_cycle_outside_the_injectors() -> None:
    graph = imports()
    assert [c for c in cycles(graph) if not all(m.startswith("headrace.injectors") for m in c)] == []


def test_no_cycle_even_through_type_only_imports() -> None:
    assert [c for c in cycles(imports(with_type_only=True))
            if not all(m.startswith("headrace.injectors") for m in c)] == []


def test_the_engine_imports_nothing_from_the_store_or_spark() -> None:
    graph = imports(with_type_only=True)
    reached, todo = set(), [m for m in graph if m == "headrace.engine" or m.startswith("headrace.engine.")]
    while todo:  # everything the engine imports, directly or not
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    assert sorted(m for m in reached if m.startswith(("headrace.store", "headrace.spark"))) == []


def test_model_topology_engine_store_and_monitor_import_without_pyspark() -> None:
    names = sorted(n for n in modules() if any(n == m or n.startswith(m + ".") for m in NO_SPARK))
    script = f"""
import sys
class NoSpark:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pyspark", "py4j"):
            raise ImportError(f"{{name}} imported: this module must import without Spark")
sys.meta_path.insert(0, NoSpark())
import importlib
for name in {names!r}:
    importlib.import_module(name)
print(len({names!r}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(names)) and len(names) > 20


def long_modules() -> Iterator[object]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield pytest.param(path, id=str(path.relative_to(SRC)))


@pytest.mark.parametrize("path", long_modules())
def test_no_module_is_over_450_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SRC)} has {lines} lines: split it"


def runtime_duplicates() -> list[str]:
    if shutil.which("duplicates") is None:
        pytest.skip("the `duplicates` command is not installed here (it is on the development machines' PATH)")
    for name in MICRO_BATCH + CONTINUOUS:
        assert (SRC / name).exists(), f"{name} moved: update MICRO_BATCH and CONTINUOUS in {Path(__file__).name}"
    out = subprocess.run(["duplicates", "--repo", str(SRC), "--min-lines", "6", "--most", "200", "--seconds", "120"],
                         capture_output=True, text=True, check=True).stdout
    assert "incomplete:" not in out, out
    pairs = re.findall(r"^D\d+ (\S+?):\d+-\d+ ~ (\S+?):\d+-\d+", out, re.MULTILINE)
    assert pairs or re.search(r"no duplicates", out), out  # the output is what this parser expects
    return [f"{a} ~ {b}" for a, b in pairs
            if (a in MICRO_BATCH and b in CONTINUOUS) or (a in CONTINUOUS and b in MICRO_BATCH)]


def test_no_code_repeated_between_the_two_runtimes() -> None:
    assert runtime_duplicates() == []


def test_mypy_checks_every_module_under_src() -> None:
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"].get("overrides", [])
    assert [o["module"] for o in overrides if o.get("ignore_errors")] == []
