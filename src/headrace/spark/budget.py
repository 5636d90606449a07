"""How often a run takes a failure that it can recover from before the failure stands."""

from __future__ import annotations

__all__ = ["FailureBudget"]


class FailureBudget:
    """How often a run takes a failure that is not headrace's (a Spark task or a Python process
    that died; a Kafka sink fenced with its lease still its own) and goes on: ``limit`` in
    ``window_s`` seconds, then the failure stands."""

    def __init__(self, limit: int = 10, window_s: float = 60.0):
        self.limit, self.window_s = limit, window_s
        self.spent: list[float] = []

    def spend(self, now: float) -> bool:
        """One more failure at ``now`` (monotonic seconds); False once the budget is gone."""
        self.spent = [t for t in self.spent if now - t < self.window_s] + [now]
        return len(self.spent) < self.limit
