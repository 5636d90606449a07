"""Spark's own checkpoints (a micro-batch computation's query, a sink's, a streaming-DataFrame
injector's), bound to the store they were made against, and read where headrace needs them."""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import OptionError
from ..store import Store

__all__ = ["checkpoint_root", "clear_unfinished_writes", "offsets_read", "logged_offset", "logged_batch"]


def checkpoint_root(store: Store, topology: str, checkpoint_dir: str | None) -> str:
    """Where the topology's Spark checkpoints live, bound to the store they were made against:
    by default under ``<sqlite file>.checkpoints/`` (or ``./headrace.checkpoints/`` for a server
    store) and the store's instance id; a given ``checkpoint_dir`` that holds another store's
    checkpoints is refused, since Spark would resume offsets that this store never journaled."""
    instance = store.instance_id()
    if checkpoint_dir is None:
        base = store.url[len("sqlite:///"):] if store.url.startswith("sqlite:///") else os.path.abspath("headrace")
        checkpoint_dir = os.path.join(f"{base}.checkpoints", instance)
    root = os.path.join(checkpoint_dir, topology)
    marker = os.path.join(root, "STORE")
    if os.path.exists(marker):
        with open(marker) as f:
            found = f.read().strip()
        if found != instance:
            raise OptionError(f"The Spark checkpoints in {root} belong to another store", got=found,
                              hint=f"this store ({store.shown_url}) is {instance}: pass a checkpoint_dir of its own, "
                                   "or delete that directory to start the topology over")
    else:
        os.makedirs(root, exist_ok=True)
        with open(marker, "w") as f:
            f.write(instance)
    return root


def offsets_read(checkpoint: str, batch_id: int) -> dict[str, int] | None:
    """The producer batches Spark's offset log says batch ``batch_id`` read up to (its source's end
    offset, docs/monitoring.md), or None if the log is not in the expected form."""
    end = logged_offset(os.path.join(checkpoint, "offsets", str(batch_id)))
    try:
        return {str(p): int(b) for p, b in end["b"].items()} if end is not None else None
    except (KeyError, TypeError, AttributeError, ValueError):
        return None


def clear_unfinished_writes(checkpoint: str) -> list[str]:
    """Delete the temporary files a killed driver left in a query's offset and commit logs. Spark
    writes ``.N.<uuid>.tmp`` and renames it to ``N``; a query killed before its first rename is
    refused on every restart (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``). Spark never reads a
    temporary file, and a query's checkpoint has one driver, so they are safe to delete."""
    removed = []
    for log in ("offsets", "commits"):
        folder = os.path.join(checkpoint, log)
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            if name.startswith(".") and (name.endswith(".tmp") or name.endswith(".tmp.crc")):
                os.remove(os.path.join(folder, name))
                removed.append(os.path.join(log, name))
    return removed


def logged_offset(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            offset: dict[str, Any] = json.loads(f.read().splitlines()[-1])
            return offset
    except (OSError, ValueError, IndexError):
        return None


def logged_batch(checkpoint: str, end: dict[str, Any]) -> int | None:
    """The batch number (Spark's batch id + 1) of the batch whose end offset Spark logged as ``end``,
    newest first (Spark logs a batch's offsets before it plans its tasks); None if none did."""
    folder = os.path.join(checkpoint, "offsets")
    ids = sorted((int(n) for n in os.listdir(folder) if n.isdigit()), reverse=True) if os.path.isdir(folder) else []
    return next((i + 1 for i in ids if logged_offset(os.path.join(folder, str(i))) == end), None)
