"""The operators people reach for, built from headrace's primitives: windows in event time with an
allowed lateness, stream-stream joins whose state the watermark bounds, a lookup join against a
table stream, and deduplication within a time bound (docs/operators/). Each is a ``Computation``
with settings as class attributes and hooks to override; add it to a topology as any other.
For a tumbling window of a monoid with no lateness, a ``MonoidComputation`` with
``window = headrace.monoids.tumbling(...)`` folds records before the shuffle; a sliding one folds
its panes that way (docs/operators/sliding.md)."""

from .base import Window
from .dedup import Deduplicate
from .joins import IntervalJoin, WindowJoin
from .lookup import LookupJoin
from .windows import SessionWindow, SlidingWindow, TumblingWindow

__all__ = ["Window", "TumblingWindow", "SlidingWindow", "SessionWindow", "IntervalJoin", "WindowJoin",
           "LookupJoin", "Deduplicate"]
