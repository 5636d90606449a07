"""A shard's seen record ids, written and checked a batch at a time (docs/architecture.md §2.1).

Most ids are positional, ``<prefix><n>`` (``names.id_prefix``: an injector's ``inject:s:7:12``, a
Kafka offset's ``kafka:t:3:1234``): an id whose text after its last ``:`` is a canonical decimal
``n`` (digits only, no leading zero) is kept as the number ``n`` under its prefix, and a batch's
numbers under one prefix become one ``SeenRange`` row: ``low``, ``high`` and a bitmap of which
numbers in between it holds. The mapping between such an id and ``(prefix, n)`` is one to one,
so the check stays exact. Every other id is kept as itself, one row each.
"""

from __future__ import annotations

from itertools import repeat
from operator import getitem, methodcaller
from typing import Iterable, NamedTuple, Sequence

import numpy as np

__all__ = ["SeenRange", "SeenIds", "NO_IDS", "split_ids", "make_ranges", "range_holds", "range_ids", "merge_ranges"]

_DIGITS = 18  # numbers kept in a range have at most this many digits (int64 arithmetic stays exact)
_POWERS = 10 ** np.arange(_DIGITS, dtype=np.int64)  # 1, 10, ..., 10**17: how many are <= n is n's digits
_GAP = 64  # numbers further apart start a new range: a bitmap never spends more than 64 bits on a number


class SeenRange(NamedTuple):
    """The ids ``<prefix><n>`` for the ``n`` in ``[low, high]`` whose bit is set in ``bits``
    (``numpy.packbits``, little bit order, bit ``n - low``); ``newest`` is the newest timestamp of
    their records (the row is garbage once that is)."""

    prefix: str
    low: int
    high: int
    newest: int
    bits: bytes


class SeenIds(NamedTuple):
    """What a shard batch adds to its seen ids: exact ``(id, timestamp)`` rows and ranges."""

    exact: list[tuple[str, int]]
    ranges: list[SeenRange]

    def __len__(self) -> int:
        return len(self.exact) + sum(int(np.unpackbits(np.frombuffer(r.bits, np.uint8)).sum()) for r in self.ranges)


NO_IDS = SeenIds([], [])


class Split(NamedTuple):
    """A list of ids taken apart once: for each prefix, the positions (into the list) and numbers
    of its positional ids; the positions of the others."""

    groups: dict[str, tuple[np.ndarray, np.ndarray]]
    exact: list[int]


def split_ids(ids: Sequence[str]) -> Split:
    """Runs of ids that share a prefix (a segment's records are contiguous) are taken apart with
    a few calls over the run, not a few Python steps per id."""
    found: dict[str, tuple[list[range], list[np.ndarray]]] = {}
    exact: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        rid = ids[i]
        cut = rid.rfind(":") + 1
        if cut == 0:
            exact.append(i)
            i += 1
            continue
        head = rid[:cut]
        end = _run_end(ids, i, head)
        tails: list[str] = list(map(getitem, ids[i:end], repeat(slice(cut, None))))
        numbers = _canonical(tails)
        if numbers is None:  # some id of the run is not positional: each is taken on its own
            for j, tail in enumerate(tails, start=i):
                one = _canonical([tail])
                if one is None:
                    exact.append(j)
                else:
                    _add(found, head, range(j, j + 1), one)
        else:
            _add(found, head, range(i, end), numbers)
        i = end
    groups = {head: (np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in spans]), np.concatenate(parts))
              for head, (spans, parts) in found.items()}
    exact.sort()
    return Split(groups, exact)


def _add(found: dict[str, tuple[list[range], list[np.ndarray]]], head: str, span: range, numbers: np.ndarray) -> None:
    spans, parts = found.setdefault(head, ([], []))
    spans.append(span)
    parts.append(numbers)


def _run_end(ids: Sequence[str], start: int, head: str) -> int:
    """The first position after ``start`` whose id does not begin with ``head``: windows that
    double in size, each checked in one call."""
    step, at, n = 16, start + 1, len(ids)
    starts = methodcaller("startswith", head)
    while at < n:
        window = list(map(starts, ids[at:at + step]))
        if not all(window):
            return at + window.index(False)
        at += step
        step *= 2
    return n


def _canonical(tails: list[str]) -> np.ndarray | None:
    """The numbers the tails spell, if every one is a canonical decimal of at most 18 digits
    (ASCII digits, no leading zero): else None."""
    lengths = np.fromiter(map(len, tails), np.int64, len(tails))
    if lengths.min() < 1 or lengths.max() > _DIGITS:
        return None
    joined = "".join(tails)
    if not (joined.isascii() and joined.isdigit()):
        return None
    numbers = np.fromiter(map(int, tails), np.int64, len(tails))
    digits = np.maximum(np.searchsorted(_POWERS, numbers, side="right"), 1)
    return numbers if bool((digits == lengths).all()) else None


def make_ranges(prefix: str, numbers: np.ndarray, timestamps: np.ndarray) -> list[SeenRange]:
    """The ranges holding these distinct ``numbers`` (sorted) under ``prefix``, ``timestamps``
    being their records' (in the same order): one range, unless numbers lie far apart."""
    if len(numbers) == 0:
        return []
    cuts = np.flatnonzero(np.diff(numbers) > _GAP) + 1
    out = []
    for part, stamps in zip(np.split(numbers, cuts), np.split(timestamps, cuts)):
        low, high = int(part[0]), int(part[-1])
        bitmap = np.zeros(high - low + 1, np.uint8)
        bitmap[part - low] = 1
        out.append(SeenRange(prefix, low, high, int(stamps.max()), np.packbits(bitmap, bitorder="little").tobytes()))
    return out


def range_holds(r: SeenRange, numbers: np.ndarray) -> np.ndarray:
    """One bool per number: whether ``r`` holds it."""
    inside = (numbers >= r.low) & (numbers <= r.high)
    out = np.zeros(len(numbers), bool)
    if inside.any():
        offsets = numbers[inside] - r.low
        bits = np.frombuffer(r.bits, np.uint8)
        out[inside] = (bits[offsets >> 3] >> (offsets & 7).astype(np.uint8)) & 1 == 1
    return out


def range_numbers(r: SeenRange) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(r.bits, np.uint8), bitorder="little")[: r.high - r.low + 1]
    return np.flatnonzero(bits).astype(np.int64) + r.low


def range_ids(r: SeenRange) -> list[str]:
    return [f"{r.prefix}{n}" for n in range_numbers(r).tolist()]


def merge_ranges(ranges: Iterable[SeenRange]) -> list[SeenRange]:
    """The same numbers in as few ranges as the gaps allow, each prefix on its own (a re-partition
    gives every shard every id); a merged range is as new as the newest range in it."""
    by_prefix: dict[str, list[SeenRange]] = {}
    for r in ranges:
        by_prefix.setdefault(r.prefix, []).append(r)
    out = []
    for prefix, group in sorted(by_prefix.items()):
        each = [range_numbers(r) for r in group]
        numbers = np.concatenate(each)
        stamps = np.concatenate([np.full(len(n), r.newest, np.int64) for n, r in zip(each, group)])
        order = np.lexsort((stamps, numbers))
        numbers, stamps = numbers[order], stamps[order]
        last = np.concatenate((np.diff(numbers) != 0, [True]))  # of each number, its newest stamp
        out.extend(make_ranges(prefix, numbers[last], stamps[last]))
    return out
