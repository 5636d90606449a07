"""State TTL on Spark, in each mode and both time domains, against the model of
tests/unit/engine/test_state_ttl.py: each record sees the count its key's living state has, a
key's state is gone a TTL after its last change, and every expiry happens once."""

from __future__ import annotations

from typing import Any

import pytest

from headrace import Topology, injectors, key_by, read, run
from headrace.store import open_store

from ..unit.engine.test_state_ttl import Visits, model

START = 1_800_000_000_000


def event_time_events() -> list[tuple[str, int]]:
    """Keys visited in bursts: within a burst 10 ms apart, bursts of a key 400-2,000 ms apart."""
    out = []
    for burst in range(12):
        for i in range(8):
            out.append((f"k{(burst + i) % 5}", START + burst * 700 + i * 10 + (burst % 3) * 300))
    return sorted(out, key=lambda e: e[1])


@pytest.mark.parametrize("mode", ["microbatch", "continuous"])
def test_state_ttl_in_event_time_equals_the_model(spark: Any, store_url: str, mode: str) -> None:
    ttl = 1_000
    events = event_time_events()
    t = Topology(f"ttl-event-{mode}")
    t.inject("visits", injectors.records([{"key": k, "ts": at} for k, at in events], timestamp="ts",
                                         batch_size=8))
    t.add(Visits, inputs={"visits": key_by("key")}, outputs=["seen", "warned"], shards=2, state_ttl_ms=ttl)
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    seen, expired = model(events, ttl)
    got = sorted((r.value["key"], r.value["n"], r.timestamp) for r in read("seen", store_url))
    assert got == sorted((k, n, at) for (k, n), (_, at) in zip(seen, events))
    store = open_store(store_url)
    assert store.counters("Visits")["state_expired"] == expired
    assert all(store.state("Visits", f"k{i}") is None for i in range(5)), "every state expired by the end of time"
    store.close()


@pytest.mark.parametrize("mode", [pytest.param("microbatch", marks=pytest.mark.slow), "continuous"])
def test_state_ttl_in_wall_clock_time_expires_a_quiet_key(spark: Any, store_url: str, mode: str) -> None:
    """Key x is visited five times at once, then, after 8 s of other keys, five times again: with a
    3 s TTL in wall-clock time its second visits count from 1 again; other keys are seen once."""
    rate = 50
    values = ([{"key": "x", "ts": START + i} for i in range(5)]
              + [{"key": f"filler{i}", "ts": START + 5 + i} for i in range(8 * rate)]
              + [{"key": "x", "ts": START + 10_000 + i} for i in range(5)])
    t = Topology(f"ttl-wall-{mode}")
    t.inject("visits", injectors.generator(lambda i: values[i], count=len(values), timestamp="ts", rate=rate,
                                           batch_size=5))
    t.add(Visits, inputs={"visits": key_by("key")}, outputs=["seen", "warned"], shards=2, state_ttl_ms=3_000,
          state_ttl_domain="wall")
    run(t, store=store_url, spark=spark, progress=None, timeout_s=300, mode=mode)
    counts = sorted(r.value["n"] for r in read("seen", store_url) if r.value["key"] == "x")
    assert counts == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert all(r.value["n"] == 1 for r in read("seen", store_url) if r.value["key"] != "x")
