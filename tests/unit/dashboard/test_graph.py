"""The topology graph's layout: every stage and stream is a node, every edge points right."""

from __future__ import annotations

from typing import Any

from headrace.dashboard.graph import layout, upstream_injectors


def zeitgeist_graph() -> dict[str, Any]:
    """A graph as ``headrace.monitor.graph.record_topology`` records it (the fields the dashboard reads)."""
    def spec(inputs: list[str], outputs: list[str], upstream: list[str]) -> dict[str, Any]:
        return {"inputs": inputs, "outputs": outputs, "upstream": upstream, "shards": 2}

    return {"name": "zeitgeist", "mode": "continuous",
            "injectors": {"inject:searches": {"stream": "searches", "parts": ["inject:searches"]}},
            "computations": {"WindowCounter": spec(["searches"], ["window_counts"], ["inject:searches"]),
                             "ModelCalculator": spec(["window_counts"], ["scored"], ["WindowCounter"]),
                             "SpikeDetector": spec(["scored"], ["anomalies"], ["ModelCalculator"]),
                             "DipDetector": spec(["scored"], ["anomalies", "DipDetector.dead_letter"],
                                                 ["ModelCalculator"])}}


def test_every_stage_and_stream_is_a_node_in_its_column() -> None:
    shown = layout(zeitgeist_graph())
    nodes = {n["id"]: n for n in shown["nodes"]}
    assert {n: nodes[n]["kind"] for n in nodes} == {
        "inject:searches": "injector", "stream:searches": "stream", "WindowCounter": "computation",
        "stream:window_counts": "stream", "ModelCalculator": "computation", "stream:scored": "stream",
        "SpikeDetector": "computation", "DipDetector": "computation", "stream:anomalies": "stream",
        "stream:DipDetector.dead_letter": "stream"}
    assert nodes["stream:anomalies"]["label"] == "anomalies"
    columns = sorted({n["x"] for n in nodes.values()})
    assert [columns.index(nodes[n]["x"]) for n in ("inject:searches", "stream:searches", "WindowCounter",
                                                   "stream:window_counts", "ModelCalculator", "stream:scored",
                                                   "SpikeDetector", "stream:anomalies")] == list(range(8))
    assert nodes["SpikeDetector"]["x"] == nodes["DipDetector"]["x"] and nodes["SpikeDetector"]["y"] != nodes["DipDetector"]["y"]
    for a, b in shown["edges"]:
        assert nodes[a]["x"] < nodes[b]["x"], (a, b)
    assert ["ModelCalculator", "stream:scored"] in shown["edges"] and ["stream:scored", "DipDetector"] in shown["edges"]
    for n in nodes.values():
        assert 0 <= n["x"] and n["x"] + n["width"] <= shown["width"] and 0 <= n["y"] and n["y"] + n["height"] <= shown["height"]


def test_a_computation_late_in_the_topology_still_goes_right_of_its_inputs() -> None:
    graph = zeitgeist_graph()
    # added first, reading the last stream: its column comes from the longest path, not the order
    graph["computations"] = {"Archive": {"inputs": ["anomalies"], "outputs": [], "upstream": ["SpikeDetector"],
                                         "shards": 1}, **graph["computations"]}
    nodes = {n["id"]: n for n in layout(graph)["nodes"]}
    assert nodes["Archive"]["x"] > nodes["stream:anomalies"]["x"] > nodes["SpikeDetector"]["x"]


def test_upstream_injectors_follow_every_path() -> None:
    graph = zeitgeist_graph()
    graph["injectors"]["inject:clicks"] = {"stream": "clicks", "parts": ["inject:clicks/0", "inject:clicks/1"]}
    graph["computations"]["ModelCalculator"]["upstream"].append("inject:clicks")
    assert upstream_injectors(graph) == {"WindowCounter": ["inject:searches"],
                                         "ModelCalculator": ["inject:clicks", "inject:searches"],
                                         "SpikeDetector": ["inject:clicks", "inject:searches"],
                                         "DipDetector": ["inject:clicks", "inject:searches"]}
