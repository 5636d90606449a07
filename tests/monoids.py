"""The monoid the tests' monoid computations build on: integers under addition."""

from __future__ import annotations

from typing import Any

from headrace import MonoidComputation


class Adding(MonoidComputation):
    """Integers under addition; each record counts 1 unless ``lift`` says otherwise. Subclasses add
    ``emit`` (and ``window``, ``lift`` as they need)."""

    def zero(self) -> int:
        return 0

    def lift(self, record: Any) -> int:
        return 1

    def combine(self, a: int, b: int) -> int:
        return a + b
