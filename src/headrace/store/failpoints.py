"""Failpoints from the environment, for chaos tests that must kill a process mid-commit.

``HEADRACE_FAILPOINTS="before_commit=sleep:200:/tmp/marks"`` makes every store opened in this
process (and in Spark's Python workers, which inherit the environment) sleep 200 ms at that
commit step, with a file ``/tmp/marks/<pid>`` present while it sleeps, so a chaos monkey can
SIGKILL a process that is provably inside a transaction. Several ``step=...`` go with ``;``; steps
that may sleep at once in one process (a Kafka sink's and a Delta sink's, both on the driver) need
a mark directory each, since both markers would be the same ``<pid>`` file.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from ..errors import OptionError
from .base import COMMIT_STEPS

__all__ = ["failpoint_from_env", "STEPS"]

# The commit steps; ``stream_read``: inside a read task of a stream's DataFrame view, after each
# segment it hands on (when a sink writes the stream, that task is the sink's write); and
# ``rescale``: inside the transaction that re-partitions a computation's keys (store/rescale.py);
# ``lake_commit``: inside a Delta or Iceberg sink's write, between the data files it writes and
# the table commit that makes them visible (headrace/lake); ``sink_commit``: a Kafka sink's
# transaction, its records and ledger sent, just before its commit.
STEPS = (*COMMIT_STEPS, "stream_read", "rescale", "lake_commit", "sink_commit")


def failpoint_from_env(value: str | None = None) -> Callable[[str], None] | None:
    spec = os.environ.get("HEADRACE_FAILPOINTS", "") if value is None else value
    if not spec:
        return None
    actions: dict[str, tuple[float, str | None]] = {}
    for part in spec.split(";"):
        step, _, action = part.partition("=")
        kind, _, rest = action.partition(":")
        ms, _, mark_dir = rest.partition(":")
        if step not in STEPS or kind != "sleep" or not ms.isdigit():
            raise OptionError("HEADRACE_FAILPOINTS entries read step=sleep:MS[:MARK_DIR]", got=part,
                              hint=f"steps are {list(STEPS)}")
        actions[step] = (int(ms) / 1000, mark_dir or None)

    def failpoint(step: str) -> None:
        action = actions.get(step)
        if action is None:
            return
        seconds, mark_dir = action
        mark = os.path.join(mark_dir, str(os.getpid())) if mark_dir else None
        if mark:
            open(mark, "w").close()
        time.sleep(seconds)
        if mark:
            os.unlink(mark)

    return failpoint
