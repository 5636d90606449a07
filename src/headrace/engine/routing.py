"""Keyed delivery, the producer's side (docs/architecture.md §3.7): a producer keys what it writes
to a stream once for each consumer of the stream, with the consumer's own key extractor, and
writes each consumer interval's records apart (a *routed* segment), as MillWheel sends each
record to its key's owner. A consumer then reads only its own intervals' records, already keyed,
and no record is keyed twice however many workers a consumer has.

The stream's own segment is written as well: it is the bus that any reader replays (``read``,
DataFrames, sinks, a consumer added later). Which consumers a batch was routed for, and under which
of their layouts, is its producer's *routing plan*, journaled with the batch: a consumer reads a
batch's routed segments when the batch's plan routed for it, and keys the stream's segment
itself otherwise (``engine/intake.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Sequence

from ..model import KeyExtractor
from .batch import Production, Routed, Routing, shards_of

__all__ = ["Subscriber", "RoutingPlan", "keys_of", "EMPTY_PLAN"]


class Subscriber(NamedTuple):
    """A consumer of a stream, as its producers route for it: its name, its key extractor and how
    many key intervals it has."""

    consumer: str
    extractor: KeyExtractor
    shards: int


def keys_of(extractor: KeyExtractor, values: Sequence[Any]) -> tuple[list[str | None], list[str | None] | None]:
    """Each value's key, calling the extractor once per value; a value without a key has None and,
    in the second list (None when every value has a key), the reason."""
    if extractor.field is not None:
        keys = extractor.many(list(values))
        if keys is not None:
            return list(keys), None
    out: list[str | None] = []
    errors: list[str | None] = []
    failed = False
    for value in values:
        try:
            out.append(extractor(value))
            errors.append(None)
        except Exception as exc:
            out.append(None)
            errors.append(f"{type(exc).__name__}: {exc}")
            failed = True
    return out, errors if failed else None


@dataclass(frozen=True)
class RoutingPlan:
    """Per stream, the consumers its producers route for."""

    subscribers: Mapping[str, tuple[Subscriber, ...]] = field(default_factory=dict)

    @property
    def routes(self) -> dict[str, dict[str, list[Any]]]:
        """``{stream: {consumer: [intervals, extractor fingerprint]}}``: what a consumer needs to
        know of the plan to read what it routed (under its own layout, with its own extractor)."""
        return {s: {sub.consumer: [sub.shards, sub.extractor.fingerprint] for sub in subs}
                for s, subs in sorted(self.subscribers.items()) if subs}

    @property
    def id(self) -> str:
        """A name for the plan, the same in every process: its routes."""
        return hashlib.sha1(json.dumps(self.routes, sort_keys=True).encode()).hexdigest()[:16]

    def routes_for(self, stream: str) -> bool:
        return bool(self.subscribers.get(stream))

    def route(self, stream: str, values: Sequence[Any]) -> list[Routed]:
        """The routed segments of ``values``, records of ``stream`` in this order. A record with no
        key goes to every interval: interval 0 dead-letters it, and under ``on_error="fail"`` each
        interval stops at it, so that none goes past a batch whose keys a fixed extractor may change."""
        out: list[Routed] = []
        for sub in self.subscribers.get(stream, ()):
            keys, errors = keys_of(sub.extractor, values)
            dests = shards_of(keys, sub.shards, {})
            rows_by_dest: dict[int, list[int]] = {}
            everywhere = range(sub.shards)
            for i, dest in enumerate(dests):
                for d in (everywhere if dest is None else (dest,)):
                    rows_by_dest.setdefault(d, []).append(i)
            for dest, rows in sorted(rows_by_dest.items()):
                out.append(Routed(stream, sub.consumer, dest, rows, [keys[i] for i in rows],
                                  None if errors is None else [errors[i] for i in rows]))
        return out

    def route_productions(self, productions: Sequence[Production]) -> list[Routed]:
        """Every stream's routed segments of a batch's productions (rows index each stream's own)."""
        by_stream: dict[str, list[Any]] = {}
        for p in productions:
            by_stream.setdefault(p.stream, []).append(p.value)
        return [r for stream, values in by_stream.items() for r in self.route(stream, values)]


EMPTY_PLAN = RoutingPlan()
