"""The web dashboard: ``headrace dashboard --store URL``, or ``headrace.run(..., dashboard_port=0)``.

``Dashboard(store).start()`` serves it in a background thread (``server.py``); ``graph.py`` keeps
each topology's description in the store and lays it out; ``history.py`` reads the plots' series.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Dashboard", "check_port"]


def __getattr__(name: str) -> Any:
    # the runners import .graph to record their topology; bottle loads only where a dashboard is served
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
