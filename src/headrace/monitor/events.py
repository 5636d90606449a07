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

__all__ = ["ALERT", "CLEARED", "ERROR", "record_error", "blamed", "active_alerts", "last_errors", "wall_ms"]

ALERT, CLEARED, ERROR = "alert", "cleared", "error"


def wall_ms() -> int:
    return int(time.time() * 1000)


def record_error(store: Store, name: str, exc: BaseException, at: int | None = None) -> None:
    """Remember ``exc`` as the last error of stage (or topology) ``name``."""
    store.add_event(name, ERROR, wall_ms() if at is None else at,
                    json.dumps({"type": type(exc).__name__, "message": str(exc)}))


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
