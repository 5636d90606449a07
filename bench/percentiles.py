"""The one percentile the benchmarks print: nearest rank, the value at ``floor(q * n)`` of the
sorted values (so p50 of an even count is the upper middle), NaN for no values.

>>> percentile([5.0, 1.0, 3.0, 2.0], 0.5), percentile([1.0, 2.0], 0.99)
(3.0, 2.0)
>>> percentile([], 0.5)
nan
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
