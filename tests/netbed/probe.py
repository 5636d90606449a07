"""What the test asks from inside a host of the bed (run there with ``ip netns exec``), printed
as one JSON value:

- ``probe.py workers UI_URL``: how many workers the Spark master's web UI shows alive;
- ``probe.py fetch STORE_URL KIB TIMES``: the seconds each of TIMES fetches of a KIB KiB value from
  the PostgreSQL server took, over one connection (the first query, which connects, not timed).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from typing import Any


def workers(ui_url: str) -> int:
    with urllib.request.urlopen(ui_url, timeout=5) as r:
        state = json.load(r)
    return sum(w["state"] == "ALIVE" for w in state["workers"])


def fetch(store_url: str, kib: int, times: int) -> list[float]:
    import psycopg

    with psycopg.connect(store_url, autocommit=True, connect_timeout=30) as db:
        db.execute("SELECT 1").fetchall()
        took = []
        for _ in range(times):
            start = time.perf_counter()
            (value,) = db.execute("SELECT repeat('x', %s)", (kib * 1024,)).fetchone()
            took.append(time.perf_counter() - start)
            assert len(value) == kib * 1024
    return took


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    result: Any = workers(args[0]) if command == "workers" else fetch(args[0], int(args[1]), int(args[2]))
    print(json.dumps(result))
