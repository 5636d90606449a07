"""Injectors: where records enter a topology, with their timestamps, ids and low watermark.

An injector yields ``InjectedBatch``es; the runner publishes each one (segment, journal entry,
watermark, resume point) in one store transaction, so a restarted injector resumes from its last
published batch and never publishes one twice.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..errors import OptionError
from ..model import BEGINNING_OF_TIME, END_OF_TIME, to_millis

__all__ = ["timestamper", "records", "generator", "files", "several", "backfill", "kafka", "InjectedBatch", "Injector", "Several", "Backfill"]


@dataclass
class InjectedBatch:
    records: list[tuple[Any, int, str | None]]  # (value, timestamp, id or None for positional ids)
    watermark: int
    checkpoint: str
    # records the injector could not take, bound for the stream's dead-letter stream (same shape)
    dead_letters: list[tuple[Any, int, str | None]] = field(default_factory=list)


LATEST_SANE_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def wall_clock_ms() -> int:
    """The default ``clock`` of the injectors that read the time: now, in ms since the epoch."""
    return int(time.time() * 1000)


def _sane(ts: int, value: Any) -> int:
    if not 0 <= ts <= LATEST_SANE_MS:
        raise OptionError("Injected record has an absurd timestamp", got_text=f"{ts} in {value!r}",
                          hint="timestamps are integer milliseconds since the Unix epoch (1970 to 9999): "
                               "were these seconds, microseconds or nanoseconds?")
    return ts


def _timestamp_of(timestamp: str | Callable[[Any], Any] | None, clock: Callable[[], int]) -> Callable[[Any], int]:
    if timestamp is None:
        return lambda value: clock()
    if isinstance(timestamp, str):
        field = timestamp

        def by_field(value: Any) -> int:
            try:
                raw = value[field]
            except (KeyError, TypeError, IndexError):
                raise OptionError(f"Injected record has no timestamp field {field!r}", got=value,
                                  hint="fix the record, or pass timestamp=<field name or function>") from None
            return _sane(to_millis(raw, f"timestamp field {field!r}"), value)
        return by_field
    if callable(timestamp):
        return lambda value: _sane(to_millis(timestamp(value), "injected timestamp"), value)
    raise OptionError("An injector's timestamp must be a field name, a function or None", got=timestamp,
                      hint="e.g. timestamp='ts' or timestamp=lambda v: v['time']")


def timestamper(timestamp: str | Callable[[Any], Any] | None,
                clock: Callable[[], int] = wall_clock_ms) -> Callable[[Any], int]:
    """How an injector stamps a value: ``timestamp`` is a field name, a function of the value, or
    None (the ``clock``), and a stamp outside 1970 to 9999 is refused (``records`` uses this)."""
    return _timestamp_of(timestamp, clock)


class Injector:
    """Base: turns values into batches; ``bounded`` injectors end with the end-of-time watermark.
    One that waits for input should yield now and then even when it has nothing new (the batch
    it last yielded, without its records): such a batch is not published, and lets the runner
    end a stopped run's injector (its generator closed, so its ``finally`` runs)."""

    bounded = False

    def batches(self, resume: str | None) -> Iterator[InjectedBatch]:  # pragma: no cover - abstract
        raise NotImplementedError


class RecordsInjector(Injector):
    def __init__(self, iterable: Iterable[Any] | Callable[[], Iterable[Any]], timestamp: Any = None,
                 id: Callable[[Any], str] | None = None, batch_size: int = 1000, rate: float | None = None,
                 max_delay_ms: int = 0, bounded: bool | None = None, clock: Callable[[], int] = wall_clock_ms):
        if batch_size < 1:
            raise OptionError("An injector's batch_size must be at least 1", got=batch_size, hint="e.g. batch_size=1000")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
            raise OptionError("An injector's rate must be a number of records per second > 0", got=rate,
                              hint="e.g. rate=1000, or leave it out for no limit")
        if isinstance(max_delay_ms, bool) or not isinstance(max_delay_ms, int) or max_delay_ms < 0:
            # a negative delay would put the watermark ahead of the records and drop them as late
            raise OptionError("An injector's max_delay_ms must be an integer >= 0", got=max_delay_ms,
                              hint="e.g. max_delay_ms=1000")
        self._source = iterable
        self._ts = _timestamp_of(timestamp, clock)
        self._id = id
        self.batch_size = batch_size
        self.rate = rate
        self.max_delay_ms = max_delay_ms
        self.bounded = bounded if bounded is not None else isinstance(iterable, Sequence)

    def _items(self) -> Iterable[Any]:
        return self._source() if callable(self._source) else self._source

    def batches(self, resume: str | None) -> Iterator[InjectedBatch]:
        position = int(resume) if resume else 0
        items = self._items()
        exact = isinstance(items, Sequence)
        suffix_min: list[int] = []
        if exact:
            stamps = [self._ts(v) for v in items]
            suffix_min = list(itertools.accumulate(reversed(stamps), min))[::-1] + [END_OF_TIME]
        iterator = iter(items)
        for _ in itertools.islice(iterator, position):
            pass
        high = None
        started = time.monotonic()
        sent = 0
        while True:
            chunk = list(itertools.islice(iterator, self.batch_size))
            out = []
            for value in chunk:
                ts = self._ts(value)
                high = ts if high is None or ts > high else high
                out.append((value, ts, self._id(value) if self._id else None))
            position += len(chunk)
            done = len(chunk) < self.batch_size
            if done:
                watermark = END_OF_TIME
            elif exact:
                watermark = suffix_min[position]
            else:
                watermark = (high - self.max_delay_ms) if high is not None else BEGINNING_OF_TIME
            yield InjectedBatch(out, watermark, str(position))
            sent += len(chunk)
            if done:
                return
            if self.rate:
                delay = sent / self.rate - (time.monotonic() - started)
                if delay > 0:
                    time.sleep(delay)


def records(iterable: Iterable[Any] | Callable[[], Iterable[Any]], timestamp: Any = None, *,
            id: Callable[[Any], str] | None = None, batch_size: int = 1000, rate: float | None = None,
            max_delay_ms: int = 0, clock: Callable[[], int] = wall_clock_ms) -> RecordsInjector:
    """Inject the values of ``iterable``. A list's low watermark is exact (the oldest timestamp
    not yet injected); any other iterable promises records at most ``max_delay_ms`` behind the
    newest seen. Once exhausted, the end of time. Without ``timestamp``, a record's timestamp is
    ``clock()`` (ms since the epoch) when it is injected."""
    return RecordsInjector(iterable, timestamp, id, batch_size, rate, max_delay_ms, clock=clock)


def generator(make: Callable[[int], Any], count: int | None = None, *, timestamp: Any = None,
              rate: float | None = None, max_delay_ms: int = 1000, batch_size: int = 1000,
              clock: Callable[[], int] = wall_clock_ms) -> RecordsInjector:
    """Inject ``make(0)``, ``make(1)``, ... (``count`` of them, or forever). ``make`` must be a
    function of its index alone, so a restarted injector regenerates exactly what it lost.
    Without ``timestamp``, a record's timestamp is ``clock()`` when it is injected."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise OptionError("generator()'s count must be an integer >= 0, or None for forever", got=count,
                          hint="e.g. count=1000")
    counter = range(count) if count is not None else None
    source: Callable[[], Iterable[Any]] = (
        (lambda: (make(i) for i in counter)) if counter is not None else (lambda: (make(i) for i in itertools.count())))
    return RecordsInjector(source, timestamp, None, batch_size, rate, max_delay_ms, bounded=count is not None,
                           clock=clock)


def files(path: str, format: str = "jsonl", timestamp: Any = None, *, bounded: bool = False,
          pattern: str = "*", poll_s: float = 0.5, clock: Callable[[], int] = wall_clock_ms) -> "FilesInjector":
    """Inject the lines of every file in ``path`` matching ``pattern`` (relative to ``path``; e.g.
    ``"*/*.jsonl"``), keyed by their path: new files as they appear and lines appended to files
    already read (unless ``bounded``: one pass). A line that cannot be decoded, parsed or stamped
    goes to the stream's dead-letter stream naming file and line. Once no file has unread lines,
    the low watermark is ``clock()`` (ms since the epoch); ``injectors/tail.py`` says more."""
    return FilesInjector(path, format, _timestamp_of(timestamp, clock), bounded, pattern, poll_s, clock)


class Several:
    """One stream fed by several injectors at once (MillWheel's injector processes). Each part
    publishes on its own with its own low watermark; consumers see the minimum over the parts."""

    def __init__(self, parts: Sequence[Injector]):
        if not parts or not all(isinstance(p, Injector) for p in parts):
            raise OptionError("several() takes one or more injectors", got=list(parts),
                              hint="e.g. injectors.several(injectors.files('/logs/a'), injectors.files('/logs/b'))")
        self.parts = list(parts)


def several(*parts: Injector) -> Several:
    return Several(parts)


from .backfill import Backfill, backfill  # noqa: E402  (it builds on the injectors above)
from .tail import FilesInjector  # noqa: E402
from .kafka import kafka  # noqa: E402
