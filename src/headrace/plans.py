"""A topology as each runtime needs it, derived once: who produces each stream in a mode, each
computation's read side (``engine.consumer.Consumer``) and its routing plan for keyed delivery
(``engine.routing.RoutingPlan``). Both runners, their workers and tasks, and the injectors take
their plans from here."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from .engine.consumer import Consumer
from .engine.monoid import fold_streams
from .engine.routing import RoutingPlan, Subscriber
from .engine.worker import IntervalPlan
from .model import MonoidComputation
from .names import CONTINUOUS, MICROBATCH, interval, parse_producer
from .topology import Topology

__all__ = ["producers_of", "consumer_of", "routing_plan", "interval_plans", "retired_producers", "shards_of"]

Layouts = Mapping[str, int]  # a computation's intervals now, where live rebalancing changed them


def shards_of(topology: Topology, name: str, layouts: Layouts | None = None) -> int:
    """How many intervals computation ``name`` has: as the topology declares, or as rebalanced."""
    return (layouts or {}).get(name, topology.computation(name).options.shards)


def producers_of(topology: Topology, stream: str, mode: str, layouts: Layouts | None = None) -> list[str]:
    """Who writes ``stream`` in ``mode``: the injector's parts, then each computation that outputs
    it: as itself in micro-batch mode, as each of its key intervals in continuous mode."""
    names = list(topology.injections[stream].producers) if stream in topology.injections else []
    for spec in list(topology.computations.values()):
        if stream in spec.outputs:
            names.extend([spec.name] if mode == MICROBATCH else
                         [interval(spec.name, i) for i in range(shards_of(topology, spec.name, layouts))])
    return names


def consumer_of(topology: Topology, name: str, mode: str, retired: Mapping[str, tuple[str, ...]] | None = None,
                layouts: Layouts | None = None) -> Consumer:
    """Computation ``name``'s read side in ``mode``; ``retired``: per stream, the intervals of an
    upstream's earlier, larger layout (continuous mode), read to their end."""
    spec = topology.computation(name)
    retired = retired or {}
    dedup = topology.dedup_streams(name)
    options = replace(spec.options, shards=shards_of(topology, name, layouts))
    return Consumer(name, options, dict(spec.inputs),
                    {s: tuple(producers_of(topology, s, mode, layouts)) + retired.get(s, ()) for s in spec.inputs},
                    dedup, topology.checked_schemas(name),
                    fold_streams(spec.inputs, dedup) if issubclass(spec.cls, MonoidComputation) else frozenset(),
                    frozenset(p for s in spec.inputs for p in retired.get(s, ())))


def routing_plan(topology: Topology, streams: frozenset[str] | None = None, running: frozenset[str] | None = None,
                 layouts: Layouts | None = None) -> RoutingPlan:
    """Who a producer of ``streams`` (every stream: None) routes for: each computation that reads
    it (of ``running``, when given), with its key extractor and its number of intervals."""
    subscribers: dict[str, list[Subscriber]] = {}
    for spec in list(topology.computations.values()):
        if running is not None and spec.name not in running:
            continue
        for stream, extractor in spec.inputs.items():
            if streams is None or stream in streams:
                subscribers.setdefault(stream, []).append(
                    Subscriber(spec.name, extractor, shards_of(topology, spec.name, layouts)))
    return RoutingPlan({s: tuple(subs) for s, subs in subscribers.items()})


def interval_plans(topology: Topology, retired: Mapping[str, tuple[str, ...]] | None = None,
                   running: frozenset[str] | None = None, layouts: Layouts | None = None) -> list[IntervalPlan]:
    """What the continuous workers run: every computation (of ``running``, when given)."""
    names = [n for n in list(topology.computations) if running is None or n in running]
    return [IntervalPlan(consumer_of(topology, n, CONTINUOUS, retired, layouts), topology.computation(n).cls,
                         frozenset(topology.computation(n).outputs),
                         routing_plan(topology, frozenset(topology.computation(n).outputs), running, layouts))
            for n in names]


def retired_producers(declared: Mapping[str, list[str]], topology: Topology,
                      layouts: Layouts | None = None) -> dict[str, tuple[str, ...]]:
    """Per stream: the intervals that wrote it under a computation's earlier, larger layout
    (``C/<i>`` with ``i`` past its count now), from the producers ``declared`` in the store;
    consumers still read them to their end."""
    out: dict[str, tuple[str, ...]] = {}
    for stream in topology.streams():
        current = set(producers_of(topology, stream, CONTINUOUS, layouts))
        writers = {spec.name for spec in topology.computations.values() if stream in spec.outputs}
        out[stream] = tuple(p for p in declared.get(stream, ()) if p not in current
                            and (parsed := parse_producer(p)).kind == "interval" and parsed.name in writers)
    return out
