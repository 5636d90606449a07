"""Fixtures shared by the store tests.

``store_url`` is the one place a new store implementation joins the conformance and crash
suites: add its URL factory to ``STORE_URLS`` (e.g. a PostgreSQL database per test) and every
test that takes ``store_url`` runs against it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from headrace.store import Store, open_store

STORE_URLS: dict[str, Callable[[Path], str]] = {
    "sqlite": lambda tmp: f"sqlite:///{tmp}/store.db",
    # "postgresql": lambda tmp: <a fresh database per test>,
}


@pytest.fixture(params=sorted(STORE_URLS))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORE_URLS[request.param](tmp_path)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def reopen(store_url: str) -> Iterator[Callable[[], Store]]:
    """Open more store objects on the same URL (what another process would do); closed at teardown."""
    opened: list[Store] = []

    def _open() -> Store:
        s = open_store(store_url)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()
