"""Fixtures shared by the store tests.

``store_url`` is the one place a store implementation joins the conformance and crash suites:
every test that takes it runs on SQLite (a file per test) and on a real PostgreSQL server (a
database per test, on the session's server).
"""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from headrace.store import Store, open_store


@pytest.fixture
def store_url(each_store: str) -> str:
    return each_store


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
