"""Low watermark arithmetic, as small pure functions (MillWheel §4.5 and §7.2).

low watermark of A = min(oldest unfinished work of A, low watermarks of A's producers),
and a published watermark never moves back.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ..model import END_OF_TIME

__all__ = [
    "input_low_watermark",
    "output_low_watermark",
    "injector_low_watermark",
    "is_late",
    "Clock",
]

Clock = Callable[[], int]


def input_low_watermark(producer_watermarks: Iterable[int], percentile: float = 100.0) -> int:
    """The low watermark of a computation's input: the minimum over every producer.

    With no producer at all nothing can ever arrive, which is the end of time. A ``percentile``
    below 100 is MillWheel's percentile low watermark (§7.2): the slowest ``100 - percentile`` %
    of the producers are ignored, so one straggler does not hold everything back; records a
    straggler sends behind it are late for this consumer.
    """
    if percentile >= 100.0:
        return min(producer_watermarks, default=END_OF_TIME)
    ordered = sorted(producer_watermarks)
    if not ordered:
        return END_OF_TIME
    ignored = int(len(ordered) * (100.0 - percentile) / 100.0)
    return ordered[min(ignored, len(ordered) - 1)]


def output_low_watermark(previous: int, input_watermark: int, holds: Iterable[int] = ()) -> int:
    """A computation's new output low watermark.

    ``holds`` are the timestamps of its unfinished work (pending watermark timers, records not
    yet done). The result never moves back: if a hold is already behind what was published,
    the published value stands and the work it holds is late for consumers.
    """
    candidate = min(input_watermark, min(holds, default=END_OF_TIME))
    return candidate if candidate > previous else previous


def injector_low_watermark(
    previous: int,
    unfinished: Iterable[int],
    clock: Clock,
    max_delay_ms: int,
    exhausted: bool = False,
) -> int:
    """An injector's low watermark.

    The oldest timestamp among work it has not finished publishing (MillWheel Figure 10: the
    oldest creation time of unfinished files) if there is any; otherwise the clock minus the
    delay it promises records never exceed. An exhausted bounded injector publishes the end of
    time. Never moves back.
    """
    if exhausted:
        return END_OF_TIME
    pending = min(unfinished, default=None)
    candidate = pending if pending is not None else clock() - max_delay_ms
    return candidate if candidate > previous else previous


def is_late(timestamp: int, low_watermark: int) -> bool:
    """A record is late when its timestamp is behind the low watermark it arrives under."""
    return timestamp < low_watermark

