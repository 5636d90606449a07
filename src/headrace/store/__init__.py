"""Backing stores, opened by URL: ``sqlite:///path/file.db`` (embedded default) or
``postgresql://user@host:port/database`` (a server, for clusters)."""

from __future__ import annotations

import os
from typing import Callable
from urllib.parse import parse_qs, urlparse

from ..errors import OptionError
from .redact import redact_url
from .base import COMMIT_STEPS, DEFAULT_STORE_URL, BatchInfo, Store, StoredRecord
from .failpoints import failpoint_from_env
from .segments import segment_limit
from .postgres import PostgresStore
from .sqlite import SQLiteStore

__all__ = ["open_store", "shared_store", "Store", "SQLiteStore", "PostgresStore", "COMMIT_STEPS", "BatchInfo",
           "StoredRecord", "DEFAULT_STORE_URL"]


_SHARED: dict[tuple[str, int], Store] = {}


def shared_store(url: str) -> Store:
    """This process's one open store for ``url``, kept open (Spark's Python workers are reused
    across tasks, so a task must not pay for a connection)."""
    key = (url, os.getpid())
    store = _SHARED.get(key)
    if store is None:
        store = _SHARED[key] = open_store(url)
    return store


def open_store(url: str, *, clock: Callable[[], int] | None = None, name: str | None = None,
               read_only: bool = False) -> Store:
    """Open the store a URL names: ``sqlite:///relative.db``, ``sqlite:////absolute/path.db``,
    ``postgresql://user:password@host:5432/database``. ``clock`` (ms since the epoch) stamps what
    the store records the time of (journal rows, segments): tests inject one. ``name`` says who
    opens it (``headrace-worker``, ...) where the server shows its connections (PostgreSQL's
    ``application_name``). ``read_only``: for tools that only look; the store must exist (a
    mistyped path is an error, not a new empty store) and nothing is written to it (SQLite's
    ``mode=ro``, PostgreSQL's ``default_transaction_read_only``), so a read-only file works."""
    store = _open(url, clock, name, read_only)
    store.segment_limit = segment_limit()
    return store


def _open(url: str, clock: Callable[[], int] | None, name: str | None, read_only: bool) -> Store:
    if not isinstance(url, str):
        raise OptionError("A store is named by a URL string", got_text=redact_url(url),
                          hint=f"pass store={DEFAULT_STORE_URL!r}")
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = url[len("sqlite:///"):].split("?", 1)[0] if url.startswith("sqlite:///") else ""
        if not path:
            raise OptionError("A SQLite store URL needs a file path", got=redact_url(url),
                              hint="write sqlite:///relative/file.db or sqlite:////absolute/file.db")
        options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        sync = options.pop("synchronous", "NORMAL").upper()
        if sync not in ("OFF", "NORMAL", "FULL", "EXTRA") or options:
            raise OptionError("Unknown SQLite store option", got=parsed.query,
                              hint="the one option is synchronous=OFF|NORMAL|FULL|EXTRA")
        return SQLiteStore(path, synchronous=sync, failpoint=failpoint_from_env(), clock=clock, read_only=read_only)
    if parsed.scheme in ("postgresql", "postgres"):
        if not parsed.path.strip("/"):
            raise OptionError("A PostgreSQL store URL needs a database name", got=redact_url(url),
                              hint="write postgresql://user@host:5432/database")
        return PostgresStore(url, failpoint=failpoint_from_env(), clock=clock, name=name, read_only=read_only)
    raise OptionError("Unknown store URL scheme", got=redact_url(url),
                      hint="use sqlite:///path/file.db or postgresql://user@host:5432/database")
