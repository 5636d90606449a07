"""Watching a pipeline from its store (docs/monitoring.md): ``status`` of every stage, a key's
``state`` and ``timers``, a computation's ``dead_letters``. Engine-free: it reads the store only."""

from .inspect import dead_letters, state, timers
from .status import status

__all__ = ["status", "state", "timers", "dead_letters"]
