"""The dashboard's server on a real store, without Spark: its page, plotly served from the
installed package, the JSON it polls, key lookups, and the errors it gives."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import pytest

import headrace
from headrace import Computation, Topology, cli, injectors, key_by
from headrace.dashboard import Dashboard
from headrace.errors import OptionError
from headrace.monitor.graph import record_topology
from headrace.store import open_store
from headrace.testing import Harness


class Tally(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("forget", record.timestamp + 60_000)


@pytest.fixture
def board(each_store: str) -> Iterator[Dashboard]:
    url = each_store
    topology = Topology("served")
    topology.inject("words", injectors.records([], timestamp="ts"))
    topology.add(Tally, inputs={"words": key_by("w")}, shards=1)
    store = open_store(url)
    record_topology(store, topology, "continuous", {"words": ["inject:words"]})
    store.publish("inject:words", 1, {}, 5_000)
    store.close()
    harness = Harness(Tally, store=url, shards=1)
    harness.process("cats", {"w": "cats"}, 1_000)
    harness.process("cats", {"w": "cats"}, 2_000)
    board = Dashboard(url).start()
    yield board
    board.stop()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_page_and_plotly_come_from_this_machine(board: Dashboard) -> None:
    status, page = get(board.url)
    assert status == 200
    scripts = re.findall(rb'<script src="([^"]+)"', page)
    assert scripts == [b"/static/plotly.min.js", b"/static/dashboard.js"]  # no CDN: every script is local
    status, plotly = get(board.url + "static/plotly.min.js")
    assert status == 200 and plotly == (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    assert get(board.url + "static/dashboard.js")[0] == 200 and get(board.url + "static/nothing.js")[0] == 404


def test_the_overview_has_the_graph_the_history_and_the_status(board: Dashboard) -> None:
    status, body = get(board.url + "api/overview")
    overview = json.loads(body)
    assert status == 200
    [topology] = overview["topologies"]
    assert topology["stages"] == ["inject:words", "Tally"]
    assert {n["id"] for n in topology["graph"]["nodes"]} == {"inject:words", "stream:words", "Tally"}
    assert topology["history"]["watermarks"]["inject:words"]["watermark"] == [5_000]
    assert set(overview["status"]["stages"]) == {"inject:words", "Tally"}


def test_a_key_lookup_shows_state_and_timers_and_says_what_is_wrong(board: Dashboard) -> None:
    status, body = get(board.url + "api/key?computation=Tally&key=cats")
    assert status == 200
    assert json.loads(body) == {"computation": "Tally", "key": "cats", "state": 2,
                                "timers": [{"tag": "forget", "timestamp": 62_000, "domain": "watermark"}]}
    status, body = get(board.url + "api/key?computation=Nope&key=cats")
    assert status == 400 and json.loads(body)["error"].startswith("No computation 'Nope' in ")
    status, body = get(board.url + "api/key?key=cats")
    assert status == 400 and json.loads(body) == {"error": "A key lookup needs a computation and a key "
                                                           "(got {'key': 'cats'}). Hint: /api/key?computation="
                                                           "WindowCounter&key=cats"}


def test_a_port_in_use_or_out_of_range_is_refused(board: Dashboard, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    port = int(board.url.rsplit(":", 1)[1].strip("/"))
    with pytest.raises(OptionError, match=re.escape(
            f"The dashboard cannot listen on 127.0.0.1:{port}: Address already in use (got {port}). "
            "Hint: pick another port (0 takes any free one), or stop what listens there")):
        Dashboard(board.app.config["headrace.store"].url, port=port)
    assert cli.main(["dashboard", "--store", f"sqlite:///{tmp_path}/other.db", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == (
        "headrace: The dashboard's port must be an integer from 0 to 65535 (got 70000). "
        "Hint: e.g. dashboard_port=8050, or 0 for any free port")


def test_run_refuses_a_bad_dashboard_port_before_spark_starts(tmp_path: Path) -> None:
    topology = Topology("never_runs")
    topology.inject("words", injectors.records([], timestamp="ts"))
    topology.add(Tally, inputs={"words": key_by("w")})
    with pytest.raises(OptionError, match=re.escape(
            "The dashboard's port must be an integer from 0 to 65535 (got '8050'). "
            "Hint: e.g. dashboard_port=8050, or 0 for any free port")):
        headrace.run(topology, store=f"sqlite:///{tmp_path}/s.db", dashboard_port="8050")  # type: ignore[arg-type]
    assert not (tmp_path / "s.db").exists()  # refused before the store was opened or Spark started
