"""The topology graph as the dashboard draws it: the graph a run records in the store
(``headrace.monitor.graph``), laid out in columns, left to right: injectors, then streams and
computations alternating."""

from __future__ import annotations

from typing import Any

__all__ = ["layout", "upstream_injectors"]

COLUMN_WIDTH, ROW_HEIGHT, NODE_WIDTH, NODE_HEIGHT, MARGIN = 160, 56, 136, 34, 8


def layout(graph: dict[str, Any]) -> dict[str, Any]:
    """Nodes (id, kind, label, x, y, width, height) and edges of one recorded topology graph.

    A node's column is its longest path from an injector, so every edge points right; each column
    is centred on the tallest one.
    """
    kinds: dict[str, str] = {}
    edges: list[tuple[str, str]] = []
    for name, injector in graph["injectors"].items():
        kinds[name] = "injector"
        kinds[f"stream:{injector['stream']}"] = "stream"
        edges.append((name, f"stream:{injector['stream']}"))
    for name, spec in graph["computations"].items():
        kinds[name] = "computation"
        for stream in spec["inputs"]:
            kinds.setdefault(f"stream:{stream}", "stream")
            edges.append((f"stream:{stream}", name))
        for stream in spec["outputs"]:
            kinds.setdefault(f"stream:{stream}", "stream")
            edges.append((name, f"stream:{stream}"))
    column = dict.fromkeys(kinds, 0)
    for _ in kinds:  # a recorded topology is acyclic (Topology refuses cycles): settled within len(kinds) rounds
        moved = [b for a, b in edges if column[b] < column[a] + 1]
        for a, b in edges:
            column[b] = max(column[b], column[a] + 1)
        if not moved:
            break
    members: dict[int, list[str]] = {}
    for node in kinds:  # insertion order: the topology's own order within a column
        members.setdefault(column[node], []).append(node)
    tallest = max((len(m) for m in members.values()), default=1)
    nodes = []
    for col, names in sorted(members.items()):
        top = MARGIN + (tallest - len(names)) * ROW_HEIGHT / 2
        for row, node in enumerate(names):
            nodes.append({"id": node, "kind": kinds[node], "label": node.removeprefix("stream:"),
                          "x": MARGIN + col * COLUMN_WIDTH, "y": top + row * ROW_HEIGHT,
                          "width": NODE_WIDTH, "height": NODE_HEIGHT})
    return {"name": graph["name"], "nodes": nodes, "edges": [list(e) for e in edges],
            "width": 2 * MARGIN + max(members, default=0) * COLUMN_WIDTH + NODE_WIDTH,
            "height": 2 * MARGIN + (tallest - 1) * ROW_HEIGHT + NODE_HEIGHT}


def upstream_injectors(graph: dict[str, Any]) -> dict[str, list[str]]:
    """Per computation, the injectors (stage names) whose records reach it through any path."""
    found: dict[str, set[str]] = {}

    def reach(stage: str) -> set[str]:
        if stage in graph["injectors"]:
            return {stage}
        if stage not in found:
            found[stage] = set()  # acyclic, so never read before it is filled in
            found[stage] = set().union(*(reach(u) for u in graph["computations"].get(stage, {}).get("upstream", [])))
        return found[stage]

    return {name: sorted(reach(name)) for name in graph["computations"]}
