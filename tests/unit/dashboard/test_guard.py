"""The dashboard refuses a foreign Host header on loopback (DNS rebinding) and, on any other address,
a request without the token its URL carries."""

from __future__ import annotations

import http.client
import urllib.parse
from pathlib import Path
from typing import Any

from headrace import Computation
from headrace.dashboard import Dashboard
from headrace.testing import Harness


class Noop(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = record.value


def _ask(port: int, path: str, host_header: str, cookie: str = "") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host_header, **({"Cookie": cookie} if cookie else {})})
        response = conn.getresponse()
        return response.status, response.read().decode(), response.getheader("Set-Cookie") or ""
    finally:
        conn.close()


def _store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/store.db"
    Harness(Noop, store=url, shards=1).process("k", 1, 1_000)
    return url


def test_a_foreign_host_header_is_refused_on_loopback(tmp_path: Path) -> None:
    board = Dashboard(_store(tmp_path)).start()
    try:
        port = board.server.server_port
        assert "token" not in board.url
        assert _ask(port, "/api/overview", f"127.0.0.1:{port}")[0] == 200
        assert _ask(port, "/api/overview", f"localhost:{port}")[0] == 200
        status, body, _ = _ask(port, "/api/overview", f"evil.example:{port}")
        assert status == 403 and "only requests for a loopback host" in body
    finally:
        board.stop()


def test_an_unauthenticated_request_is_refused_on_a_non_loopback_address(tmp_path: Path) -> None:
    board = Dashboard(_store(tmp_path), host="0.0.0.0").start()
    try:
        port = board.server.server_port
        token = urllib.parse.parse_qs(urllib.parse.urlsplit(board.url).query)["token"][0]
        assert len(token) >= 24
        status, body, _ = _ask(port, "/api/overview", f"0.0.0.0:{port}")
        assert status == 401 and "needs its token" in body
        assert _ask(port, "/api/overview?token=wrong", f"0.0.0.0:{port}")[0] == 401
        status, _, cookie = _ask(port, f"/?token={token}", f"0.0.0.0:{port}")
        assert status == 200 and cookie.startswith(f"headrace_token={token}")
        # the page's own requests carry the cookie it set
        assert _ask(port, "/api/overview", f"0.0.0.0:{port}", cookie=f"headrace_token={token}")[0] == 200
        assert _ask(port, "/api/overview", f"0.0.0.0:{port}", cookie="headrace_token=guess")[0] == 401
    finally:
        board.stop()
