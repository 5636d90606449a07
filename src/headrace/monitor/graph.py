"""The topology as the store remembers it: written when a run starts, read by ``status`` and the
inspection tools on any machine, with or without the pipeline running (the store alone knows
which computation reads which stream, and which codec its state is in, only from this record)."""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

from ..store import Store
from ..topology import Topology

__all__ = ["record_topology", "recorded_graphs", "injector_stage"]

PREFIX = "topology:"


def injector_stage(stream: str) -> str:
    """The stage name of the injector of ``stream`` (its parts publish as ``inject:<stream>/<i>``)."""
    return f"inject:{stream}"


def record_topology(store: Store, topology: Topology, mode: str, bus: Mapping[str, list[str]]) -> None:
    """Remember ``topology`` in ``store``: its stages, what each reads and writes, the options
    monitoring needs, and ``bus``: per stream, the producer names its consumers read in ``mode``."""
    writers: dict[str, list[str]] = {s: [injector_stage(s)] for s in topology.injections}
    for spec in topology.computations.values():
        for stream in spec.outputs:
            writers.setdefault(stream, []).append(spec.name)
    graph: dict[str, Any] = {
        "name": topology.name, "mode": mode, "recorded_at": int(time.time() * 1000),
        "injectors": {injector_stage(s): {"stream": s, "parts": list(i.producers), "delivery": i.options.delivery}
                      for s, i in topology.injections.items()},
        "computations": {spec.name: {
            "inputs": list(spec.inputs), "outputs": list(spec.outputs),
            "upstream": sorted({w for s in spec.inputs for w in writers.get(s, [])}),
            "shards": spec.options.shards, "codec": spec.options.codec.name, "late": spec.options.late,
            "on_error": spec.options.on_error, "semantics": spec.options.semantics,
            "productions": spec.options.productions, "alert_lag_ms": spec.options.alert_lag_ms,
        } for spec in topology.computations.values()},
        "bus": {s: list(bus[s]) for s in sorted(topology.streams())},
    }
    store.put_meta(PREFIX + topology.name, json.dumps(graph, sort_keys=True))


def recorded_graphs(store: Store) -> list[dict[str, Any]]:
    """Every topology recorded in ``store``, by name."""
    return [json.loads(v) for _, v in sorted(store.metas(PREFIX).items())]
