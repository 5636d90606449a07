"""Watching a pipeline from its store (docs/monitoring.md): ``status`` of every stage, a key's
``state`` and ``timers``, a computation's ``dead_letters``. Engine-free: it reads the store only,
but for ``recode_state``, which moves a computation's state to another codec (``owners.py``)."""

from .inspect import dead_letters, state, timers
from .owners import recode_state
from .status import status

__all__ = ["status", "state", "timers", "dead_letters", "recode_state"]
