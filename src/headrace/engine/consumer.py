"""A computation as the read side sees it (``Consumer``), its input watermark, and what it reads
next of each producer (``plan_ranges``): the batches past its positions, and whether their
producers routed them for it under its own layout (docs/architecture.md §3.7)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ..model import END_OF_TIME, ComputationOptions, KeyExtractor
from ..names import parse_producer
from .ports import Head, IntervalStore
from .shard import ValueCheck
from .watermark import input_low_watermark

__all__ = ["Consumer", "Range", "plan_ranges", "input_watermark"]


@dataclass(frozen=True)
class Consumer:
    """A computation as the read side sees it: its subscriptions (stream -> key extractor, and the
    producers that write the stream), how it treats bad input, the typed streams it checks, the
    streams a monoid folds where they are read, and the retired producers of an earlier layout
    (read to their end, then left out of its watermark)."""

    name: str
    options: ComputationOptions
    inputs: Mapping[str, KeyExtractor]
    producers: Mapping[str, tuple[str, ...]]
    dedup_streams: frozenset[str] = frozenset()
    schemas: Mapping[str, ValueCheck] = field(default_factory=dict)
    fold_streams: frozenset[str] = frozenset()
    retired: frozenset[str] = frozenset()

    @property
    def shards(self) -> int:
        return self.options.shards

    @property
    def all_producers(self) -> list[str]:
        return sorted({p for ps in self.producers.values() for p in ps})

    def streams_of(self, producer: str) -> list[str]:
        return [s for s, ps in self.producers.items() if producer in ps]

    def with_parts(self, declared: Mapping[str, Sequence[str]]) -> "Consumer":
        """This consumer with the injector parts declared for its streams since it was planned (a
        Kafka partition added while running is a new producer of its stream)."""
        producers = dict(self.producers)
        for stream, names in declared.items():
            if stream in producers:
                parts = [p for p in names if p not in producers[stream]
                         and (parsed := parse_producer(p)).kind == "injector" and parsed.name == stream]
                producers[stream] = producers[stream] + tuple(sorted(parts))
        return self if producers == self.producers else replace(self, producers=producers)


def input_watermark(consumer: Consumer, mark_of: Callable[[str], int]) -> int:
    """The consumer's input low watermark when it has read each producer up to the batch whose
    journaled output watermark ``mark_of(producer)`` gives: per stream the (percentile) minimum
    over its producers, then the minimum over streams (MillWheel §4.5, §7.2)."""
    return min((input_low_watermark([mark_of(p) for p in producers if p not in consumer.retired],
                                    consumer.options.percentile(stream))
                for stream, producers in consumer.producers.items()), default=END_OF_TIME)


class Range(NamedTuple):
    """Batches (after, upto] of a producer, read from the consumer's routed segments (routed under
    ``layout`` intervals) or, when ``layout`` is None, from the streams' own segments."""

    producer: str
    after: int
    upto: int
    layout: int | None


def plan_ranges(store: IntervalStore, consumer: Consumer, positions: Mapping[str, int],
                heads: Mapping[str, Head], plans: dict[str, Any]) -> list[Range]:
    """What to read of each producer past ``positions`` up to its head, and where: one range when
    every batch since followed the head's routing plan (the common case), else one per run of
    batches routed alike (``batch_plans``). ``plans`` caches plans by id."""
    out: list[Range] = []
    for producer in consumer.all_producers:
        head = heads.get(producer)
        after = positions.get(producer, 0)
        if head is None or head.batch <= after:
            continue
        if head.plan_since is not None and head.plan_since <= after + 1:
            out.append(Range(producer, after, head.batch, _layout(store, consumer, producer, head.plan, plans)))
            continue
        run: Range | None = None
        for batch, plan in store.batch_plans(producer, after, head.batch):
            layout = _layout(store, consumer, producer, plan, plans)
            if run is not None and run.layout == layout:
                run = run._replace(upto=batch)
                continue
            if run is not None:
                out.append(run)
            run = Range(producer, batch - 1, batch, layout)
        if run is not None:
            out.append(run)
    return out


def _layout(store: IntervalStore, consumer: Consumer, producer: str, plan: str | None,
            plans: dict[str, Any]) -> int | None:
    """How many intervals a plan routed for ``consumer`` on every stream it reads of ``producer``,
    keyed with the extractor the consumer has now; None when it did not route all of them so."""
    if plan is None:
        return None
    if plan not in plans:
        plans[plan] = store.plan_routes(plan)
    routes = plans[plan] or {}
    layouts = set()
    for stream in consumer.streams_of(producer):
        shards, fingerprint = routes.get(stream, {}).get(consumer.name, (None, None))
        layouts.add(shards if fingerprint == consumer.inputs[stream].fingerprint else None)
    return layouts.pop() if len(layouts) == 1 and None not in layouts else None
