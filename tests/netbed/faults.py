"""The three-stage oracle pipeline of tests/chaos, run by ``headrace run`` in continuous mode on the
bed's cluster (cluster.py), and the faults the bed injects into it, each returning what shows it
happened: read from the store through its Unix socket (which no fault touches) and from the
network itself.

- ``cut_worker_link``: a worker host's link goes down for longer than a lease, at a known point of
  a commit (the worker asleep at a failpoint). Another worker takes every interval it held
  (``shards.owner``). Cut just before the commit's transaction, the worker holds no lock and its
  session stays open; once the link is back, its commit is refused (``fenced`` events in
  ``events``). Cut inside the transaction, its row locks would stall every other writer; the server
  ends that session after one lease (its transaction rolled back), and the others go on.
- ``throttle_store_link``: the store's link is rate limited both ways. A round trip and a 256 KiB
  fetch over it are timed before and during; the limiter's counters show it held traffic back;
  the pipeline goes on committing.
- ``kill_worker_host``: every process of a worker host is SIGKILLed. Another worker takes over its
  intervals; a new Spark worker is started on the host, as a machine that comes back empty, and
  Spark runs the lost worker's task there again.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psycopg

from headrace.monitor.events import fenced_events
from headrace.names import meta
from headrace.store import open_store

from ..chaos.test_chaos import Divergence, cmdline
from ..cluster.test_cluster_oracle import ClusterMonkey
from .bed import Host
from .cluster import BedCluster

__all__ = ["BedMonkey", "Cut", "Throttled", "Killed", "Takeover", "cut_worker_link", "throttle_store_link",
           "kill_worker_host", "every_worker_holds_intervals"]

COMPUTATIONS = ("Tagger", "Collector", "Windows")
LEASE_S = 3.0  # continuous mode's lease (docs/architecture.md §4.2)
ENDED_IDLE = "terminating connection due to idle-in-transaction timeout"


class BedMonkey(ClusterMonkey):
    """The cluster test's monkey, its driver run on the bed's driver host: the driver and its
    workers reach the store over the network; the monkey reads it through the Unix socket."""

    def __init__(self, tmp: Path, bed: BedCluster, n: int):
        network_url, local_url = bed.database()
        super().__init__(tmp, local_url, n, "continuous", bed)  # type: ignore[arg-type]
        self.bed, self.driver_store = bed, network_url

    def driver_command(self) -> list[str]:
        # the faults are checked against leases: a rebalancer's move would look like a live lease taken
        return [*self.bed.net.prefix(self.bed.driver_host), *super().driver_command(), "--no-rebalance"]

    def driver_env(self) -> dict[str, str]:
        return {**super().driver_env(), "SPARK_LOCAL_IP": self.bed.driver_host.address}

    def owners(self) -> dict[tuple[str, int], str | None]:
        """Who holds each interval of the pipeline now."""
        return {i: owner for i, (owner, _) in self.leases().items()}

    def leases(self) -> dict[tuple[str, int], tuple[str | None, int]]:
        """Each interval's owner and the end of its lease (wall ms)."""
        store = open_store(self.store)
        try:
            return {(c, shard): (owner, until) for c in COMPUTATIONS
                    for shard, (owner, until, _) in store.interval_owners(c).items()}
        finally:
            store.close()

    def interval_commits(self, intervals: list[tuple[str, int]] | None = None) -> int:
        """How many batches the pipeline's intervals (or these of them) have committed."""
        store = open_store(self.store)
        try:
            versions = {(c, shard): v for c in COMPUTATIONS for shard, v in store.shard_versions(c).items()}
        finally:
            store.close()
        return sum(v for i, v in versions.items() if intervals is None or i in intervals)

    def metas(self, prefix: str) -> dict[str, str]:
        store = open_store(self.store)
        try:
            return store.metas(prefix)
        finally:
            store.close()

    def workers(self) -> dict[str, tuple[Host, int]]:
        """The continuous workers running now (their owner names): the host and pid of each."""
        found = {}
        for key, value in self.metas(meta.WORKER).items():
            pid = json.loads(value)["pid"]
            host = self.bed.net.host_of(pid)
            if host is not None:
                found[meta.parse_worker(key)[2]] = (host, pid)
        return found

    def moved(self) -> list[tuple[str, int]]:
        """(interval, when) of every interval the driver's rebalancer moved to another worker."""
        store = open_store(self.store)
        try:
            return [(e.name, e.at) for e in store.events(kinds=["rebalanced"])]
        finally:
            store.close()

    def fenced(self) -> list[dict[str, Any]]:
        """Every commit of a worker that was refused (``events`` of kind ``fenced``): interval, at, owner, ..."""
        store = open_store(self.store)
        try:
            return fenced_events(store)
        finally:
            store.close()

    def holdings(self) -> dict[str, list[tuple[str, int]]]:
        """Per worker host: the intervals its workers hold now."""
        where = self.workers()
        out: dict[str, list[tuple[str, int]]] = {}
        for interval, owner in self.owners().items():
            if owner in where:
                out.setdefault(where[owner][0].name, []).append(interval)
        return out

    def sessions(self, host: Host) -> list[str]:
        """The state of each connection the store's server has from ``host``."""
        with psycopg.connect(self.store, autocommit=True) as db:
            return [str(state) for (state,) in db.execute(
                "SELECT state FROM pg_stat_activity WHERE client_addr = %s::inet", (host.address,))]

    def server_log(self) -> str:
        return (Path(str(self.bed.postgres.folder)) / "server.log").read_text(errors="replace")

    def divergence_after_drain(self, timeout_s: float) -> Divergence:
        wait_for(self.drained, timeout_s, "the pipeline to drain", self.describe)
        assert self.driver is not None
        self.driver.wait(timeout=120)
        assert self.driver.returncode == 0, self.log_tail()
        return self.divergence()

    def log_tail(self) -> str:
        return (self.user_dir.parent / "drivers.log").read_text()[-4000:]

    def describe(self) -> str:
        return (f"holdings {self.holdings()}, interval commits {self.interval_commits()}, "
                f"driver log: {self.log_tail()[-1500:]}")


def wait_for(done: Callable[[], object], timeout_s: float, what: str, state: Callable[[], str] = str) -> float:
    """Poll ``done`` until true; the seconds it took. Fails naming ``what`` and the state."""
    start = time.time()
    while not done():
        if time.time() - start > timeout_s:
            raise AssertionError(f"waited {timeout_s} s for {what}: {state()}")
        time.sleep(0.1)
    return time.time() - start


def every_worker_holds_intervals(monkey: BedMonkey, hosts: list[Host], timeout_s: float = 180) -> None:
    wait_for(lambda: all(monkey.holdings().get(h.name) for h in hosts) and monkey.interval_commits() > 20, timeout_s,
             f"a worker holding intervals on each of {[h.name for h in hosts]}", monkey.describe)


def held_by(monkey: BedMonkey, host: Host) -> tuple[set[str], dict[tuple[str, int], int]]:
    """The owner names of the workers on ``host``, and the intervals they hold with the end of
    each one's lease."""
    mine = {owner for owner, (h, _) in monkey.workers().items() if h == host}
    held = {i: until for i, (owner, until) in sorted(monkey.leases().items()) if owner in mine}
    assert held, f"no worker on {host.name} holds an interval: {monkey.describe()}"
    return mine, held


@dataclass
class Takeover:
    """The intervals a lost worker held, and how other workers took them."""

    held: list[tuple[str, int]]
    lease_until: dict[tuple[str, int], int]  # the end of each one's lease once its worker was lost, wall ms
    taken_at: dict[tuple[str, int], int]  # when another worker was first seen holding it, wall ms
    taken_by: dict[tuple[str, int], str]
    after_s: float  # from the loss until another worker held every one of them


def taken_from(monkey: BedMonkey, mine: set[str], held: dict[tuple[str, int], int], host: Host) -> Takeover:
    """Once ``host``'s workers are lost: wait until other workers hold every interval of ``held``
    (with its lease's end as ``held_by`` read it), noting the last lease seen for each."""
    start = time.time()
    lease_until = dict(held)
    taken_at: dict[tuple[str, int], int] = {}
    taken_by: dict[tuple[str, int], str] = {}

    def all_taken() -> bool:
        now = int(time.time() * 1000)
        for i, (owner, until) in monkey.leases().items():
            if i not in held or i in taken_at:
                continue
            if owner in mine:
                lease_until[i] = until
            elif owner is not None:
                taken_at[i], taken_by[i] = now, str(owner)
        return len(taken_at) == len(held)

    wait_for(all_taken, 6 * LEASE_S, f"other workers to take the intervals {sorted(held)} of {host.name}",
             monkey.describe)
    return Takeover(sorted(held), lease_until, taken_at, taken_by, time.time() - start)


@dataclass
class Cut:
    host: str
    at: str  # the failpoint its worker slept at when the link went down: "begin" or "before_commit"
    owners: set[str]  # the workers on the host then
    takeover: Takeover  # of the intervals they held
    down_s: float  # how long the link was down
    committed_while_down: int  # batches its intervals' new owners committed after taking them, before the mend
    sessions_at_mend: list[str]  # the states of the server's connections from the host when it came back
    ended_by_server: int  # transactions the server ended for silence while the link was down
    fenced: dict[str, str] = field(default_factory=dict)  # its refused commits (``fenced`` events)
    window: tuple[int, int] = (0, 0)  # from the cut to the mend, wall ms


def cut_at(monkey: BedMonkey, host: Host, step: str, timeout_s: float = 60) -> int:
    """Cut ``host``'s link while its worker sleeps at failpoint ``step`` (its marker exists before
    and after the cut: the worker sends nothing more before the link is down); its pid."""
    bed = monkey.bed
    marks = bed.marks / step
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        asleep = [m for m in marks.iterdir() if m.name.isdigit() and bed.net.host_of(int(m.name)) == host]
        if not asleep:
            time.sleep(0.002)
            continue
        bed.net.cut(host)
        if asleep[0].exists():
            return int(asleep[0].name)
        bed.net.mend(host)  # it woke before the link went down: try the next commit
    raise AssertionError(f"no worker on {host.name} reached failpoint {step} in {timeout_s} s: {monkey.describe()}")


def cut_worker_link(monkey: BedMonkey, host: Host, at: str, min_down_s: float = 2 * LEASE_S) -> Cut:
    """Cut ``host``'s link while its worker sleeps at failpoint ``at``, until another worker took
    every interval it held and for at least ``min_down_s``; mend it. Cut before a commit, wait for
    the store to refuse that commit."""
    mine, held = held_by(monkey, host)
    ended = monkey.server_log().count(ENDED_IDLE)
    cut_at(monkey, host, at)
    start = time.time()
    began = int(start * 1000)
    try:
        taken = taken_from(monkey, mine, held, host)
        committed = monkey.interval_commits(taken.held)
        time.sleep(max(0.0, min_down_s - (time.time() - start)))
        committed, sessions = monkey.interval_commits(taken.held) - committed, monkey.sessions(host)
        ended = monkey.server_log().count(ENDED_IDLE) - ended
    finally:
        monkey.bed.net.mend(host)
    cut = Cut(host.name, at, mine, taken, time.time() - start, committed, sessions, ended,
              window=(began, int(time.time() * 1000)))
    if at == "begin":
        def fenced() -> dict[str, str]:  # "<owner> <C>/<i> <ms>": the refused commit, since the cut
            return {f"{e['owner']} {e['interval']} {e['at']}": e["message"] for e in monkey.fenced()
                    if e["owner"] in mine and e["at"] >= began}

        wait_for(fenced, 60, f"the refused commit of the worker cut off on {host.name}", monkey.describe)
        cut.fenced = fenced()
    return cut


@dataclass
class Throttled:
    mbit: float  # the rate limit, Mbit/s each way
    round_trip_s: float  # median seconds of a query's round trip from the driver's host to the store, before
    throttled_round_trip_s: float  # the same while throttled
    fetch_s: float  # median seconds of a 256 KiB fetch, before
    throttled_fetch_s: float
    bytes_per_s: float  # the pipeline's traffic on the store's link, before
    throttled_bytes_per_s: float
    limiter: dict[str, int]  # the rate limit's counters when it was lifted: bytes, packets, overlimits, drops
    committed_while_throttled: int  # batches the pipeline's intervals committed while throttled
    window: tuple[int, int] = (0, 0)  # from the throttle to its end, wall ms


def throttle_store_link(monkey: BedMonkey, mbit: float, hold_s: float = 10.0) -> Throttled:
    """Limit the store's link to ``mbit`` Mbit/s each way for ``hold_s``, measuring it before and during."""
    bed = monkey.bed
    store = bed.net["store"]

    def measured() -> tuple[float, float, float]:
        """The link's round trip and 256 KiB fetch; the pipeline's traffic over 2 s (alone on it)."""
        start, traffic = time.time(), bed.net.traffic(store)
        time.sleep(2)
        pipeline = (bed.net.traffic(store) - traffic) / (time.time() - start)
        trips = bed.probe(bed.driver_host, "fetch", monkey.driver_store, "0", "20")
        fetches = bed.probe(bed.driver_host, "fetch", monkey.driver_store, "256", "3")
        return statistics.median(trips), statistics.median(fetches), pipeline  # type: ignore[arg-type]

    trip, fetch, traffic = measured()
    committed = monkey.interval_commits()
    bed.net.throttle(store, f"{mbit}mbit")
    start = time.time()
    began = int(start * 1000)
    try:
        slow_trip, slow_fetch, slow_traffic = measured()
        time.sleep(max(0.0, hold_s - (time.time() - start)))
        committed = monkey.interval_commits() - committed
        limiter = bed.net.throttled(store)
    finally:
        bed.net.unthrottle(store)
    return Throttled(mbit, trip, slow_trip, fetch, slow_fetch, traffic, slow_traffic, limiter, committed,
                     (began, int(time.time() * 1000)))


@dataclass
class Killed:
    host: str
    pids: list[int]  # every process that ran on the host
    takeover: Takeover  # of the intervals its workers held
    rejoined_after_s: float  # from the kill until a continuous worker ran on the host again
    window: tuple[int, int] = (0, 0)  # from the kill to the takeover, wall ms


def kill_worker_host(monkey: BedMonkey, host: Host) -> Killed:
    """SIGKILL the host's Spark worker with its whole process group; wait for another worker to
    take its intervals; start a new Spark worker there (the machine back, empty) and wait for a
    continuous worker to run on it again."""
    bed = monkey.bed
    mine, held = held_by(monkey, host)
    began = int(time.time() * 1000)
    pids = bed.kill_worker(host)
    wait_for(lambda: not bed.net.pids(host), 10, f"every process on {host.name} to die",
             lambda: "; ".join(f"{p}: {cmdline(p)[:200]}" for p in bed.net.pids(host)))
    taken = taken_from(monkey, mine, held, host)
    window = (began, int(time.time() * 1000))
    bed.start_worker(host)  # Spark runs the lost worker's task on it again
    wait_for(lambda: any(h == host for h, _ in monkey.workers().values()), 180,
             f"a continuous worker to run on {host.name} again", monkey.describe)
    return Killed(host.name, pids, taken, time.time() - began / 1000, window)
