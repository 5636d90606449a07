"""An injector's thread (spark/injectors.py) hands every failure to the run, its store's too."""

from __future__ import annotations

from pathlib import Path

from headrace import injectors
from headrace.engine.routing import EMPTY_PLAN
from headrace.spark.injectors import InjectorThread


def test_a_store_the_injector_cannot_open_fails_the_run_instead_of_killing_its_thread(tmp_path: Path) -> None:
    """It opened its store outside the handling that reports to the run: the thread died with a
    traceback on stderr, and the run waited for an injector that would never publish."""
    (tmp_path / "file").write_text("")
    errors: list[BaseException] = []
    thread = InjectorThread("events", "inject:events", injectors.records([{"n": 1}]),
                            f"sqlite:///{tmp_path}/file/store.db", errors.append, None, EMPTY_PLAN)  # a file's child
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and len(errors) == 1, errors
    assert not thread.finished.is_set()
