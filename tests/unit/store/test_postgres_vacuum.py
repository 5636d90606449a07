"""store/postgres.py: a trim ends with a VACUUM of the bus's tables, so the next writes reuse the
space its deletes freed instead of growing the database by a replay window of dead rows (autovacuum,
switched off here as a busy server's would lag, visits a database only once a minute)."""

from __future__ import annotations

import os
from typing import Any

from headrace.engine.publish import publish_injected

from .test_retention import WINDOW, Clock, open_bus, readers, worker

BUS_TABLES = ("segments", "routes")


def publish_large(store: Any, plan: Any, batch: int, clock: Clock) -> None:
    values = [{"user": f"u{(batch * 7 + i) % 5}", "ts": batch * 100 + i, "pad": os.urandom(2_000).hex()}
              for i in range(10)]
    publish_injected(store, "inject:events", batch, "events", [(v, v["ts"], None) for v in values], batch * 100, None,
                     None, plan, 1)
    clock.now += 400


def bus_bytes(store: Any) -> int:
    return sum(int(store._one("SELECT pg_total_relation_size(?::regclass)", (t,))[0]) for t in BUS_TABLES)


def test_the_trim_vacuums_so_the_next_window_of_writes_reuses_the_space(postgres_server: Any) -> None:
    store, t, plan, clock = open_bus(postgres_server.new_database())
    try:
        for table in BUS_TABLES:
            store._x(f"ALTER TABLE {table} SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
        fast, slow = worker(store, t, "Fast", clock), worker(store, t, "Slow", clock)
        sizes = []
        for window in range(3):
            for batch in range(window * 40 + 1, window * 40 + 41):
                publish_large(store, plan, batch, clock)
                fast.step()
                slow.step()
            sizes.append(bus_bytes(store))
            clock.now += 10 * WINDOW
            store.trim(readers(t), {"events": WINDOW}, clock())
        assert sizes[0] > 1_000_000, sizes
        assert max(sizes) < 1.25 * sizes[0], f"the bus grew with each window of writes: {sizes} bytes"
    finally:
        store.close()
