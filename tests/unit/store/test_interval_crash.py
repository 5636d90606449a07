"""A continuous worker's commit crashed at each step (docs/architecture.md §2.2, §4.2), on each
store: ``commit_shards`` writes several key intervals' outcomes with their input positions and
journal rows in one transaction. A crash before it commits leaves nothing of it for another
process to see; a crash after leaves all of it. Either way the intervals' next owner, a new worker
on a new store object once the crashed one's leases have lapsed, goes on from what was committed,
and every record is counted once."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import pytest

from headrace.engine.worker import Worker
from headrace.model import END_OF_TIME
from headrace.names import interval
from headrace.names import CONTINUOUS
from headrace.plans import interval_plans, producers_of
from headrace.store import Store

from ..engine.test_worker import LEASE_MS, SHARDS, WORDS, Clock, committed, publish, run_until_idle, topology

STEPS = ("begin", "check_sequencer", "version", "counters", "before_commit", "after_commit")


class SimulatedCrash(BaseException):
    """The process dies here: a BaseException, so no ``except Exception`` on the way can swallow it."""


def positions(store: Store) -> dict[int, dict[str, int]]:
    return store.interval_positions("CountWords")


@pytest.mark.parametrize("step", STEPS)
def test_a_worker_crashed_at_any_step_of_its_commit_is_taken_over_and_every_record_counts_once(
        reopen: Callable[[], Store], step: str) -> None:
    observer, clock = reopen(), Clock()
    observer.register("CountWords", SHARDS)
    for stream in topology().streams():
        observer.declare_stream(stream, *producers_of(topology(), stream, CONTINUOUS))
    plans = interval_plans(topology())

    crashing = Worker(reopen(), plans, "crashing", 0, 1, lease_ms=LEASE_MS, clock=clock)
    crashing.maintain_leases()
    assert len(crashing.owned["CountWords"]) == SHARDS
    # a low watermark throughout: a record read twice would be counted twice, not dropped as late
    publish(observer, 1, 0, 40, 1_000)
    run_until_idle(crashing)
    before, read_before = committed(observer), positions(observer)

    publish(observer, 2, 40, 80, 1_000)
    seen: list[dict[str, Any]] = []

    def failpoint(at: str) -> None:
        if at == step:
            seen.append(committed(observer))
            raise SimulatedCrash(at)

    crashing.store.failpoint = failpoint
    with pytest.raises(SimulatedCrash, match=f"^{step}$"):
        crashing.step()
    crashing.store.close()  # the process is gone: its connection with it
    after = committed(observer)
    if step == "after_commit":
        assert seen == [after] and after != before  # the whole commit, journal rows and positions with it
        assert all(p == {"inject:words": 2} for p in positions(observer).values())
    else:
        assert seen == [before] and after == before and positions(observer) == read_before

    clock.now += 3 * LEASE_MS  # the crashed worker's leases lapse
    successor = Worker(reopen(), plans, "successor", 0, 1, lease_ms=LEASE_MS, clock=clock)
    successor.maintain_leases()
    assert len(successor.owned["CountWords"]) == SHARDS
    publish(observer, 3, 80, len(WORDS), END_OF_TIME)
    run_until_idle(successor)

    final = committed(observer)
    counted = Counter(i for inputs in final["outputs"].values() for i in inputs)
    assert len(counted) == len(WORDS) and set(counted.values()) == {1}, "each input counted once"
    finals: dict[str, int] = {}
    for producer in final["outputs"]:
        for _, r in observer.read_segments("counted", producer, 0, 1 << 30):
            finals[r.value["word"]] = max(finals.get(r.value["word"], 0), r.value["n"])
    assert finals == dict(Counter(WORDS))
    assert final["counters"]["records"] == len(WORDS) and "late_dropped" not in final["counters"]
    assert all(p == {"inject:words": 3} for p in positions(observer).values())
    for shard, version in final["versions"].items():
        journal = [b for b, _, _ in final["journal"][interval("CountWords", shard)]]
        assert journal == list(range(1, version + 1)), f"interval {shard} journaled {journal} at version {version}"
