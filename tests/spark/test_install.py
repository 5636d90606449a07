"""The built wheel, installed into a fresh virtual environment beside an already present pyspark,
runs the README's examples: at the lowest versions pyproject.toml declares, and at the lock's.

Each test builds the wheel (``pip wheel . --no-deps``), makes a venv, installs pyspark with pyarrow,
pandas and numpy first (the user's Spark environment), then the wheel, whose other dependencies
are held by a constraints file to the same end of their ranges, and runs the README's examples
there with ``doctest``, from a folder outside the repository. Downloads go through pip's cache
(~/.cache/pip): the lock's pyspark is there once ``scripts/bootstrap`` ran; the lowest one
(a 430 MB download the first time) only in the slow run. The venv (about 1 GB) is removed after.

    scripts/test --long tests/spark/test_install.py     # both ends, the whole README
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what a Spark environment has before headrace comes: pyspark and what it needs for Arrow
SPARK_ENVIRONMENT = ("pyspark", "pyarrow", "pandas", "numpy")
# the README's examples up to this heading: the model, the harness and one run on Spark
SHORT_README_UNTIL = "### Two execution modes"

RUN_README = """
import doctest, json, sys
import headrace
failed, attempted = doctest.testfile(sys.argv[1], module_relative=False, report=True)
print(json.dumps({"failed": failed, "attempted": attempted, "headrace": headrace.__file__}))
"""


def declared_ranges() -> dict[str, tuple[str, str]]:
    """pyproject.toml's runtime dependencies: ``{name: (lowest, below)}`` from ``name>=lowest,<below``."""
    ranges = {}
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([^,<>=]+),<([^,<>=]+)", requirement)
        assert match, f"{requirement!r} in pyproject.toml is not of the form name>=lowest,<below"
        ranges[match[1]] = (match[2], match[3])
    return ranges


def locked_versions() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if requirement:
            name, version = requirement.split("==")
            pins[re.sub(r"\[.*\]", "", name)] = version
    return pins


def readme_examples(folder: Path, until: str | None) -> Path:
    text = (ROOT / "README.md").read_text()
    path = folder / "README.md"
    path.write_text(text[:text.index(until)] if until else text)
    return path


@pytest.fixture
def venv(tmp_path: Path) -> Iterator[Path]:
    """A fresh virtual environment (removed after the test: it holds a whole pyspark)."""
    folder = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--quiet",
                    "--disable-pip-version-check", "-w", str(out)], check=True)
    (built,) = out.glob("headrace-*.whl")
    return built


def install_and_run_readme(venv: Path, wheel: Path, versions: dict[str, str], readme: Path) -> None:
    """Install pyspark's environment at ``versions``, then the wheel with every package ``versions``
    names held to it, and run ``readme``'s examples."""
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *(f"{name}=={versions[name]}" for name in SPARK_ENVIRONMENT)], check=True)
    constraints = readme.parent / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in versions.items()))
    subprocess.run([*pip, "--constraint", str(constraints), str(wheel)], check=True)

    expected = {name: versions[name] for name in declared_ranges()}
    names = json.dumps(sorted(expected))
    installed = json.loads(subprocess.run(
        [python, "-c", f"import json, importlib.metadata as m; print(json.dumps({{n: m.version(n) for n in {names}}}))"],
        check=True, capture_output=True, text=True).stdout)
    assert installed == expected

    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)
    done = subprocess.run([python, "-c", RUN_README, str(readme)], cwd=readme.parent, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    examples = sum(line.startswith(">>> ") for line in readme.read_text().splitlines())
    assert (outcome["failed"], outcome["attempted"]) == (0, examples), done.stdout[-5000:]
    assert outcome["headrace"].startswith(str(venv)), outcome  # the wheel's headrace, not the repository's


def test_the_wheel_runs_the_readme_harness_example_beside_the_locked_pyspark(venv: Path, wheel: Path,
                                                                              tmp_path: Path) -> None:
    install_and_run_readme(venv, wheel, locked_versions(), readme_examples(tmp_path, SHORT_README_UNTIL))


@pytest.mark.slow
def test_the_wheel_runs_the_whole_readme_beside_the_locked_pyspark(venv: Path, wheel: Path, tmp_path: Path) -> None:
    install_and_run_readme(venv, wheel, locked_versions(), readme_examples(tmp_path, None))


@pytest.mark.slow
def test_the_wheel_runs_the_whole_readme_at_the_lowest_declared_versions(venv: Path, wheel: Path,
                                                                        tmp_path: Path) -> None:
    versions = {name: lowest for name, (lowest, _) in declared_ranges().items()}
    install_and_run_readme(venv, wheel, versions, readme_examples(tmp_path, None))


def test_the_lock_pins_a_version_inside_every_declared_range() -> None:
    lock = locked_versions()
    for name, (lowest, below) in declared_ranges().items():
        assert version_key(lowest) <= version_key(lock[name]) < version_key(below), (name, lock[name])


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))
