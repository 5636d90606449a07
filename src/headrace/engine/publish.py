"""Publishing an injector's batch (every kind of injector goes through here): its stream's
segment, its routed segments for the stream's consumers (keyed delivery, ``engine/routing.py``),
its journal row with the injector's watermark and its resume point, in one transaction."""

from __future__ import annotations

from typing import Any

from ..names import dead_letter_stream, id_prefix
from .batch import Production, Routing
from .poison import picklable
from .ports import Bus
from .routing import RoutingPlan

__all__ = ["publish_injected"]


def publish_injected(store: Bus, producer: str, batch: int, stream: str, records: list[tuple[Any, int, str | None]],
                     watermark: int, checkpoint: str | None, schema: Any, plan: RoutingPlan,
                     since: int, dead_letters: list[tuple[Any, int, str | None]] | None = None) -> int:
    """Publish one injector batch of ``(value, timestamp, id or None)`` records (positional ids
    ``<producer>:<batch>:<n>`` for those without), routed by ``plan`` (followed since batch
    ``since``), and the injector's ``dead_letters`` (same shape, every one with an id) to the
    stream's dead-letter stream in the same transaction; returns how many records it published.
    A value pickle refuses is dead-lettered in its place (found only when the publish fails, so the
    good path pickles once)."""
    try:
        return _publish(store, producer, batch, stream, records, watermark, checkpoint, schema, plan, since,
                        dead_letters)
    except Exception:
        prefix = id_prefix(producer, batch)
        kept: list[tuple[Any, int, str | None]] = []
        bad: list[tuple[Any, int, str | None]] = []
        for n, (value, ts, rid) in enumerate(records):
            rid = rid or f"{prefix}{n}"  # the id it would have had
            shown = picklable(value)
            if shown is value:
                kept.append((value, ts, rid))
            else:
                bad.append(({"stream": stream, "record_id": rid, "value": shown, "error":
                             f"the value ({type(value).__name__}) cannot be pickled for the bus"}, ts, rid))
        if not bad:
            raise
        return _publish(store, producer, batch, stream, kept, watermark, checkpoint, schema, plan, since,
                        [*(dead_letters or []), *bad])


def _publish(store: Bus, producer: str, batch: int, stream: str, records: list[tuple[Any, int, str | None]],
             watermark: int, checkpoint: str | None, schema: Any, plan: RoutingPlan, since: int,
             dead_letters: list[tuple[Any, int, str | None]] | None) -> int:
    prefix = id_prefix(producer, batch)
    prods = [Production(stream, None, v, ts, rid or f"{prefix}{n}") for n, (v, ts, rid) in enumerate(records)]
    routing = (Routing(plan.id, since, plan.route(stream, [p.value for p in prods])) if plan.routes_for(stream)
               else None)
    streams = {stream: prods}
    if dead_letters:
        streams[dead_letter_stream(stream)] = [Production(dead_letter_stream(stream), None, v, ts, rid or f"{prefix}d{n}")
                                              for n, (v, ts, rid) in enumerate(dead_letters)]
    store.publish(producer, batch, streams, watermark, checkpoint,
                  {stream: schema} if schema is not None else None, routing)
    return len(prods)
