"""The dashboard's web server: a bottle app on a threaded WSGI server of the standard library.

    GET /                      the page (static/index.html), which polls /api/overview every second
    GET /static/<file>         its script and style; plotly.min.js comes from the installed plotly package
    GET /api/overview          topology graphs, status of every stage, and their history (JSON)
    GET /api/key?computation=C&key=K   the key's state and pending timers, decoded (JSON)
"""

from __future__ import annotations

import json
import threading
import time
from importlib import resources
from socketserver import ThreadingMixIn
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import bottle

from ..errors import HeadraceError, OptionError
from ..monitor import state, timers
from ..monitor.graph import recorded_graphs
from ..monitor.status import status_of
from ..store import open_store
from .graph import layout
from .guard import Guard
from .history import History

__all__ = ["Dashboard", "make_app", "check_port"]

STATIC = resources.files("headrace.dashboard") / "static"
PLOTLY = resources.files("plotly") / "package_data"


def make_app(store_url: str, window_ms: int = 5 * 60_000, unpickle: bool = False) -> bottle.Bottle:
    """The WSGI app of the dashboard of the store at ``store_url`` (opened once, shared under a lock).
    A key's pickled state is decoded only as plain data unless ``unpickle`` (docs/security.md)."""
    store = open_store(store_url, read_only=True)  # it only looks: a read-only role or file serves
    history = History(store, window_ms)
    lock = threading.Lock()
    app = bottle.Bottle()

    def as_json(work: Callable[[], Any]) -> str:
        bottle.response.content_type = "application/json"
        bottle.response.set_header("Cache-Control", "no-store")
        try:
            with lock:
                return json.dumps(work(), default=repr)
        except HeadraceError as exc:
            bottle.response.status = 400
            return json.dumps({"error": str(exc)})
        except Exception as exc:  # e.g. the store is unreachable: the page shows it and polls again
            bottle.response.status = 500
            return json.dumps({"error": f"{type(exc).__name__}: {exc}"})

    @app.get("/")
    def index() -> Any:
        return bottle.static_file("index.html", root=str(STATIC))

    @app.get("/static/plotly.min.js")
    def plotly() -> Any:
        return bottle.static_file("plotly.min.js", root=str(PLOTLY), mimetype="text/javascript")

    @app.get("/static/<name>")
    def static(name: str) -> Any:
        return bottle.static_file(name, root=str(STATIC))

    @app.get("/api/overview")
    def overview() -> str:
        def work() -> dict[str, Any]:
            now = int(time.time() * 1000)
            topologies = [{"name": g["name"], "mode": g["mode"], "stages": [*g["injectors"], *g["computations"]],
                           "graph": layout(g), "history": history.series(g, now)} for g in recorded_graphs(store)]
            return {"now_ms": now, "store": store.shown_url, "topologies": topologies, "status": status_of(store, now)}
        return as_json(work)

    @app.get("/api/key")
    def key() -> str:
        computation, name = bottle.request.query.getunicode("computation"), bottle.request.query.getunicode("key")

        def work() -> dict[str, Any]:
            if not computation or name is None:
                raise OptionError("A key lookup needs a computation and a key", got=dict(bottle.request.query),
                                  hint="/api/key?computation=WindowCounter&key=cats")
            return {"computation": computation, "key": name, "state": state(store.url, computation, name, unpickle=unpickle),
                    "timers": [t._asdict() for t in timers(store.url, computation, name)]}
        return as_json(work)

    app.config.update({"headrace.store": store, "headrace.lock": lock})
    return app


def check_port(port: object) -> int:
    """``port`` if it is one a dashboard can listen on (0: any free port)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OptionError("The dashboard's port must be an integer from 0 to 65535", got=port,
                          hint="e.g. dashboard_port=8050, or 0 for any free port")
    return port


class _Threads(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a browser's idle keep-alive connection must not hold the process open


class _Quiet(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class Dashboard:
    """``Dashboard(store).start()`` serves in a background thread; ``url`` is where; ``stop()``."""

    def __init__(self, store: str, host: str = "127.0.0.1", port: int = 0, window_ms: int = 5 * 60_000,
                 unpickle: bool = False):
        check_port(port)
        self.app = make_app(store, window_ms, unpickle)
        try:
            self.guard = Guard(self.app, host)
            self.server = make_server(host, port, self.guard, server_class=_Threads, handler_class=_Quiet)
        except OSError as exc:
            self.app.config["headrace.store"].close()
            raise OptionError(f"The dashboard cannot listen on {host}:{port}: {exc.strerror}", got=port,
                              hint="pick another port (0 takes any free one), or stop what listens there") from None
        self.url = f"http://{host}:{self.server.server_port}/" + (f"?token={self.guard.token}" if self.guard.token else "")
        self._thread: threading.Thread | None = None

    def start(self) -> "Dashboard":
        self._thread = threading.Thread(target=self.server.serve_forever, name="headrace-dashboard", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        try:
            self.server.serve_forever()
        finally:
            self.close()

    def stop(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        self.server.server_close()
        with self.app.config["headrace.lock"]:  # a request still being answered finishes with the store first
            self.app.config["headrace.store"].close()
