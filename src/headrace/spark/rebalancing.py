"""Live rebalancing in continuous mode (docs/architecture.md §4.2, "Rebalancing"): the driver, as
MillWheel's master, watches each interval's load and, while the topology runs, moves intervals
from a busy worker to an idle one, splits a hot computation's intervals and merges cold ones
(decisions: ``engine/balance.py``).

- The load: each worker reports, once a lease round, the records each of its intervals processed
  (``meta.load``); a round here turns the reports into records/s per interval.
- A move is ``store.reassign``: the interval gets a new sequencer and owner; its old owner's next
  commit of it is refused and its next renewal drops it, its new owner takes it at its next
  renewal (a second or less), from where its commits and quiet reports left it.
- A split or a merge is a rescale (``store/rescale.py``: state, timers, partials and dedup ids
  follow their keys, fences keep what was taken from being taken again, new sequencers fence the
  old layout) between two runs of the workers' job: the driver stops the job, rescales, and
  submits it again; injectors and sinks go on.
- Every decision is an ``events`` row of kind ``rebalanced`` (``headrace status``, the dashboard).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from ..engine.balance import Balancer, IntervalLoad, Move, Rescale
from ..names import REBALANCED, meta, parse_producer
from ..store import open_store

__all__ = ["Rebalancer", "REBALANCED"]


class Rebalancer:
    """A thread of the continuous driver: a round every ``every_s``."""

    def __init__(self, url: str, topology: str, run: Callable[[], str], counts: Callable[[], dict[str, int]],
                 declared: dict[str, int], lease_ms: int, rescale: Callable[[str, int], None],
                 on_error: Callable[[BaseException], None], every_s: float = 5.0, balancer: Balancer | None = None):
        self.url, self.topology, self.run, self.counts, self.declared = url, topology, run, counts, declared
        self.lease_ms, self.rescale, self.on_error, self.every_s = lease_ms, rescale, on_error, every_s
        self.balancer = balancer or Balancer()
        self.decisions: list[Move | Rescale] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="headrace-rebalancer", daemon=True)
        self._seen: dict[str, int] = {}  # a worker's last report read: each report counts once

    def start(self) -> "Rebalancer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        store = open_store(self.url, name="headrace-rebalancer")
        try:
            while not self._stopping.wait(self.every_s):
                self.round(store)
        except Exception as exc:  # surfaced by wait(): a rebalancer that fails is not worth a silent stop
            self.on_error(exc)
        finally:
            store.close()

    def loads(self, store: Any) -> dict[str, dict[tuple[str, int], IntervalLoad]]:
        """Per live worker (its owner name), the records/s of each interval it holds now."""
        run = self.run()
        workers = {meta.parse_worker(k)[2] for k in store.metas(meta.worker(self.topology, run))}
        rates: dict[tuple[str, int], IntervalLoad] = {}
        for key, text in store.metas(meta.load(self.topology, run)).items():
            report = json.loads(text)
            if self._seen.get(key) == report["at"]:
                continue  # no report since the last round: nothing processed
            self._seen[key] = report["at"]
            seconds = max(0.001, (report["at"] - report["since"]) / 1000)
            for name, (records, keys) in report["intervals"].items():
                producer = parse_producer(name)
                rates[(producer.name, int(producer.part or 0))] = IntervalLoad(records / seconds, int(keys))
        loads: dict[str, dict[tuple[str, int], IntervalLoad]] = {w: {} for w in workers}
        for computation in self.counts():
            for shard, (owner, _, _) in store.interval_owners(computation).items():
                if owner in loads:
                    loads[owner][(computation, shard)] = rates.get((computation, shard), IntervalLoad(0.0, 0))
        return loads

    def round(self, store: Any) -> list[Move | Rescale]:
        """One round: read the loads, decide, act, record."""
        decided = self.balancer.decide(self.loads(store), self.counts(), self.declared)
        for decision in decided:
            if isinstance(decision, Move):
                store.reassign(decision.computation, decision.shard, decision.target,
                               store.now() + self.lease_ms)
            else:
                self.rescale(decision.computation, decision.new)
            name = (f"{decision.computation}/{decision.shard}" if isinstance(decision, Move) else decision.computation)
            store.add_event(name, REBALANCED, store.now(),
                            json.dumps({"kind": type(decision).__name__.lower(), **decision._asdict()}))
            self.decisions.append(decision)
        return decided
