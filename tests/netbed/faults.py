"""The three-stage oracle pipeline of tests/chaos, run by ``headrace run`` in continuous mode on the
bed's cluster (cluster.py), and the faults the bed injects into it, each with what shows it
happened: read from the store (through its Unix socket, which the faults do not touch) and from
the network itself.

- ``cut_worker_link``: a worker host's link goes down for longer than a lease. Another worker
  takes over every interval it held (``shards.owner``); once the link is back, the cut-off worker's
  writes are refused (``fenced:`` rows in ``meta``).
- ``throttle_store_link``: the store's link is rate limited. A 256 KiB fetch over it is measured
  before and during; the pipeline goes on committing through it.
- ``kill_worker_host``: every process of a worker host is SIGKILLed. Another worker takes over its
  intervals; a new Spark worker is started on the host, as a machine that comes back.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from headrace.store import open_store

from ..chaos.test_chaos import Divergence
from ..cluster.test_cluster_oracle import ClusterMonkey
from .bed import Host
from .cluster import BedCluster

__all__ = ["BedMonkey", "Cut", "Throttled", "Killed", "cut_worker_link", "throttle_store_link", "kill_worker_host"]

COMPUTATIONS = ("Tagger", "Collector", "Windows")
LEASE_S = 3.0  # continuous mode's lease (docs/architecture.md §4.2)


class BedMonkey(ClusterMonkey):
    """The cluster test's monkey, its driver run on the bed's driver host: the driver and its
    workers reach the store over the network; the monkey reads it through the Unix socket."""

    def __init__(self, tmp: Path, bed: BedCluster, n: int):
        network_url, local_url = bed.database()
        super().__init__(tmp, local_url, n, "continuous", bed)  # type: ignore[arg-type]
        self.bed, self.driver_store = bed, network_url

    def driver_command(self) -> list[str]:
        return [*self.bed.net.prefix(self.bed.driver_host), *super().driver_command()]

    def driver_env(self) -> dict[str, str]:
        return {**super().driver_env(), "SPARK_LOCAL_IP": self.bed.driver_host.address}

    def owners(self) -> dict[tuple[str, int], str | None]:
        """Who holds each interval of the pipeline now."""
        store = open_store(self.store)
        try:
            return {(c, shard): owner for c in COMPUTATIONS for shard, (owner, _, _) in store.interval_owners(c).items()}
        finally:
            store.close()

    def metas(self, prefix: str) -> dict[str, str]:
        store = open_store(self.store)
        try:
            return store.metas(prefix)
        finally:
            store.close()

    def workers(self) -> dict[str, Host]:
        """The continuous workers running now (their owner names) and the host each runs on."""
        found = {}
        for key, value in self.metas("worker:").items():
            host = self.bed.net.host_of(json.loads(value)["pid"])
            if host is not None:
                found[key.split(":", 2)[2]] = host
        return found

    def holdings(self) -> dict[str, list[tuple[str, int]]]:
        """Per worker host: the intervals its workers hold now."""
        where = self.workers()
        out: dict[str, list[tuple[str, int]]] = {}
        for interval, owner in self.owners().items():
            if owner in where:
                out.setdefault(where[owner].name, []).append(interval)
        return out

    def divergence_after_drain(self, timeout_s: float) -> Divergence:
        wait_for(self.drained, timeout_s, "the pipeline to drain", self.describe)
        assert self.driver is not None
        self.driver.wait(timeout=120)
        assert self.driver.returncode == 0, self.log_tail()
        return self.divergence()

    def log_tail(self) -> str:
        return (self.user_dir.parent / "drivers.log").read_text()[-4000:]

    def describe(self) -> str:
        return f"holdings {self.holdings()}, committed {self.committed()}, driver log: {self.log_tail()[-1500:]}"


def wait_for(done: Callable[[], object], timeout_s: float, what: str, state: Callable[[], str] = str) -> float:
    """Poll ``done`` until true; the seconds it took. Fails naming ``what`` and the state."""
    start = time.time()
    while not done():
        if time.time() - start > timeout_s:
            raise AssertionError(f"waited {timeout_s} s for {what}: {state()}")
        time.sleep(0.1)
    return time.time() - start


def every_worker_holds_intervals(monkey: BedMonkey, hosts: list[Host], timeout_s: float = 180) -> None:
    wait_for(lambda: all(monkey.holdings().get(h.name) for h in hosts) and monkey.committed() > 20, timeout_s,
             "a worker holding intervals on every worker host", monkey.describe)


@dataclass
class Cut:
    host: str
    held: list[tuple[str, int]]  # the intervals its worker held when the link went down
    down_s: float  # how long the link was down
    taken_after_s: float  # when every one of them had another owner, after the cut
    taken_by: dict[tuple[str, int], str]  # their owners then
    committed_while_down: int  # interval commits by the others while it was cut off
    fenced: dict[str, str] = field(default_factory=dict)  # the meta rows of its refused writes


def cut_worker_link(monkey: BedMonkey, host: Host, min_down_s: float = 2 * LEASE_S) -> Cut:
    """Cut ``host``'s link until another worker took every interval it held, and for at least
    ``min_down_s``; mend it; wait for the store to refuse the cut-off worker's writes."""
    net = monkey.bed.net
    mine = {owner for owner, h in monkey.workers().items() if h == host}
    held = sorted(i for i, owner in monkey.owners().items() if owner in mine)
    assert held, f"no worker on {host.name} held an interval: {monkey.describe()}"
    before = monkey.committed()
    net.cut(host)
    start = time.time()
    try:
        taken = wait_for(lambda: all(monkey.owners()[i] not in mine | {None} for i in held), 6 * LEASE_S,
                         f"another worker to take the intervals {held} of cut-off {host.name}", monkey.describe)
        owners = monkey.owners()
        time.sleep(max(0.0, min_down_s - (time.time() - start)))
        committed = monkey.committed() - before
    finally:
        net.mend(host)
    down = time.time() - start
    def fenced() -> dict[str, str]:  # fenced:<run>:<owner>:<C>/<i>:<ms>
        return {k: v for k, v in monkey.metas("fenced:").items() if any(f":{o}:" in k for o in mine)}

    wait_for(fenced, 60, f"a refused write of the worker cut off on {host.name}", monkey.describe)
    return Cut(host.name, held, down, taken, {i: str(owners[i]) for i in held}, committed, fenced())


@dataclass
class Throttled:
    rate: str
    fetch_s: float  # median seconds of a 256 KiB fetch from the store, before
    throttled_fetch_s: float  # the same while throttled
    committed_while_throttled: int


def throttle_store_link(monkey: BedMonkey, rate: str = "4mbit", hold_s: float = 8.0) -> Throttled:
    bed = monkey.bed
    store = bed.net["store"]
    fetch = lambda: statistics.median(bed.probe(bed.driver_host, "fetch", monkey.driver_store, "256", "3"))  # noqa: E731
    before_s = fetch()
    committed = monkey.committed()
    bed.net.throttle(store, rate)
    start = time.time()
    try:
        during_s = fetch()
        time.sleep(max(0.0, hold_s - (time.time() - start)))
        committed = monkey.committed() - committed
    finally:
        bed.net.unthrottle(store)
    return Throttled(rate, before_s, during_s, committed)


@dataclass
class Killed:
    host: str
    pids: list[int]  # every process that ran on the host
    held: list[tuple[str, int]]
    taken_after_s: float
    taken_by: dict[tuple[str, int], str]


def kill_worker_host(monkey: BedMonkey, host: Host) -> Killed:
    """SIGKILL the host's whole process group; wait for another worker to take its intervals;
    start a new Spark worker there (the machine back, empty)."""
    bed = monkey.bed
    mine = {owner for owner, h in monkey.workers().items() if h == host}
    held = sorted(i for i, owner in monkey.owners().items() if owner in mine)
    assert held, f"no worker on {host.name} held an interval: {monkey.describe()}"
    pids = bed.kill_worker(host)
    assert bed.net.pids(host) == [], f"processes outlived the kill of {host.name}: {bed.net.pids(host)}"
    taken = wait_for(lambda: all(monkey.owners()[i] not in mine | {None} for i in held), 6 * LEASE_S,
                     f"another worker to take the intervals {held} of killed {host.name}", monkey.describe)
    owners = monkey.owners()
    bed.start_worker(host)
    return Killed(host.name, pids, held, taken, {i: str(owners[i]) for i in held})
