"""Alerts and errors as the store keeps them: rows of the ``events`` table (store/schema.py).

A lag alert is raised by an ``alert`` event and cleared by a later ``cleared`` event of the same
stage; the last ``error`` event of a stage (or of a topology, when no stage is named) is its last
error. The detail of every event is a JSON object.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..store import Store
from ..topology import Topology

__all__ = ["ALERT", "CLEARED", "ERROR", "FENCED", "record_error", "record_fenced", "fenced_events", "blamed",
           "active_alerts", "last_errors", "wall_ms"]

ALERT, CLEARED, ERROR = "alert", "cleared", "error"
FENCED = "fenced"  # a continuous worker lost a key interval to another owner: its write was refused


def wall_ms() -> int:
    return int(time.time() * 1000)


def record_error(store: Store, name: str, exc: BaseException, at: int | None = None) -> None:
    """Remember ``exc`` as the last error of stage (or topology) ``name``."""
    store.add_event(name, ERROR, wall_ms() if at is None else at,
                    json.dumps({"type": type(exc).__name__, "message": str(exc)}))


def record_fenced(store: Store, interval: str, run: str, owner: str, exc: BaseException) -> None:
    """Remember that ``owner`` (a worker of run ``run``) lost key interval ``interval`` (``C/<i>``)
    to another owner: its commit was refused with ``exc``."""
    store.add_event(interval, FENCED, wall_ms(),
                    json.dumps({"run": run, "owner": owner, "type": type(exc).__name__, "message": str(exc)}))


def fenced_events(store: Store, since_ms: int = 0) -> list[dict[str, Any]]:
    """Every interval lost to another owner since ``since_ms``: ``{interval, at, run, owner, type, message}``."""
    return [{"interval": e.name, "at": e.at, **json.loads(e.detail)} for e in store.events(since_ms, [FENCED])]


def blamed(topology: Topology, exc: BaseException) -> str:
    """The computation an error names (its messages quote it), else the topology."""
    text = str(exc)
    return next((n for n in topology.computations if f"{n!r}" in text), topology.name)


def active_alerts(store: Store) -> dict[str, dict[str, Any]]:
    """Per stage with a raised alert not cleared since: when it was raised, and its detail."""
    latest = store.latest_events([ALERT, CLEARED])  # on a tie, CLEARED (the later kind) wins
    return {name: {"stage": name, "raised_at": e.at, **json.loads(e.detail)}
            for name, e in sorted(latest.items()) if e.kind == ALERT}


def last_errors(store: Store) -> dict[str, dict[str, Any]]:
    return {name: {"at": e.at, **json.loads(e.detail)} for name, e in store.latest_events([ERROR]).items()}
