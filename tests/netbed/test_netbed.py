"""The three-stage oracle pipeline of tests/chaos in continuous mode on a cluster of network
namespaces (a Spark master, two or three Spark workers, the PostgreSQL store and the driver, each
a host with its own address; docs/architecture.md §3.12), with faults on its links and hosts: a
worker's link cut for longer than a lease (before a commit, and inside one), the store's link
throttled, a worker host killed. Each fault is shown to have happened, and the outputs must equal
the oracle: every record exactly once.

CI runs the faults in sequence in one run; ``scripts/test --long tests/netbed`` runs each fault
on its own, repeated, on three worker hosts.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from ..chaos.test_chaos import Divergence
from ..ci import in_ci
from .bed import BED_HINT, Host, why_no_bed
from .cluster import BedCluster, cluster_bed
from .faults import (LEASE_S, BedMonkey, Cut, Killed, Throttled, cut_worker_link, every_worker_holds_intervals,
                     kill_worker_host, throttle_store_link)

MBIT = 1_000_000 / 8  # bytes per second
Fault = Cut | Throttled | Killed


@contextmanager
def running_bed(tmp_path: Path, workers: int) -> Iterator[BedCluster]:
    why_not = why_no_bed()
    if why_not is not None:
        if in_ci():
            pytest.fail(f"{why_not}; CI runs as root and must run the network test bed. Hint: {BED_HINT}",
                        pytrace=False)
        pytest.skip(f"{why_not}. Hint: {BED_HINT}")
    (tmp_path / "bed").mkdir()
    with cluster_bed(tmp_path / "bed", workers) as bed:
        yield bed


@contextmanager
def pipeline(tmp_path: Path, bed: BedCluster, n: int) -> Iterator[BedMonkey]:
    """The pipeline's driver started on the driver's host, running once every worker holds intervals."""
    monkey = BedMonkey(tmp_path, bed, n)
    try:
        monkey.start_driver()
        every_worker_holds_intervals(monkey, bed.worker_hosts())
        yield monkey
    finally:
        if monkey.driver is not None and monkey.driver.poll() is None:
            os.killpg(monkey.driver.pid, signal.SIGKILL)


def busiest(monkey: BedMonkey) -> Host:
    """The worker host whose workers hold the most intervals."""
    held = monkey.holdings()
    return monkey.bed.net[max(held, key=lambda name: len(held[name]))]


def exact(monkey: BedMonkey, happened: list[Fault]) -> None:
    """The pipeline drains to outputs equal to the oracle, and no worker had a commit refused but
    one cut off before a commit, or one slowed by a throttled store link (a pass that took longer
    than its lease): a fenced worker that nothing slowed would mean its leases were taken live."""
    assert monkey.divergence_after_drain(900) == Divergence()
    cut_off = {o for f in happened if isinstance(f, Cut) and f.at == "begin" for o in f.owners}
    slowed = [(f.window[0], f.window[1] + 3 * int(LEASE_S * 1000)) for f in happened if isinstance(f, Throttled)]
    moved = monkey.moved()  # the driver's rebalancer moves intervals too: their holder's commit is refused
    for event in monkey.fenced():  # every refused commit
        owner, at = event["owner"], event["at"]
        assert (owner in cut_off or any(start <= at <= end for start, end in slowed)
                or any(i == event["interval"] and at - 2 * int(LEASE_S * 1000) <= t <= at for i, t in moved)), \
            (event, happened)
    # the executors on the worker hosts ran the user package that only the driver's host had
    assert "userjob.zip to the executors" in (monkey.user_dir.parent / "drivers.log").read_text(), monkey.log_tail()


def checked(fault: Fault) -> Fault:
    """The fault, once what shows it happened is checked."""
    print(fault)  # what happened, in the captured output of a failure
    if isinstance(fault, (Cut, Killed)):  # no interval was taken while its lease was live
        taken = fault.takeover
        assert all(taken.taken_at[i] > taken.lease_until[i] for i in taken.held), fault
    if isinstance(fault, Cut):
        assert fault.down_s >= 2 * LEASE_S and fault.committed_while_down > 0, fault
        if fault.at == "begin":  # no lock held: its session waited, open, and its commit was refused once back
            assert "idle" in fault.sessions_at_mend and fault.ended_by_server == 0, fault
            assert fault.fenced and all("was fenced off" in why for why in fault.fenced.values()), fault
            assert {tuple(k.split(" ")[1].split("/")) for k in fault.fenced} <= {
                (c, str(i)) for c, i in fault.takeover.held}, fault
        else:  # silent inside its transaction: the server ended it (its writes rolled back) with its connection
            assert fault.ended_by_server >= 1 and fault.sessions_at_mend == [], fault
    elif isinstance(fault, Throttled):
        rate = fault.mbit * MBIT
        # a 256 KiB fetch takes at least what the rate allows, and far longer than on the free link
        assert fault.throttled_fetch_s >= 256 * 1024 / rate * 0.8 > 10 * fault.fetch_s, fault
        assert fault.throttled_bytes_per_s <= 2 * rate * 1.2, fault  # each way at most the rate
        assert fault.limiter["overlimits"] > 0 and fault.committed_while_throttled > 0, fault
    else:
        assert fault.pids, fault
    return fault


def test_a_cut_a_slow_store_link_and_a_killed_worker_host_leave_the_outputs_exact(tmp_path: Path) -> None:
    with running_bed(tmp_path, workers=2) as bed, pipeline(tmp_path, bed, 32_000) as monkey:
        # each fault hits the worker host holding the most intervals then: a cut-off worker loses all
        # it held, and one slowed past its lease by the throttle may lose some
        exact(monkey, [checked(cut_worker_link(monkey, busiest(monkey), "begin")),
                       checked(throttle_store_link(monkey, 2)),
                       checked(cut_worker_link(monkey, busiest(monkey), "before_commit")),
                       checked(kill_worker_host(monkey, busiest(monkey)))])


REPEATED: dict[str, Callable[[BedMonkey, int], Fault]] = {
    "cut": lambda monkey, i: cut_worker_link(monkey, busiest(monkey), ("begin", "before_commit")[i % 2]),
    "throttle": lambda monkey, i: throttle_store_link(monkey, (1, 4)[i % 2], hold_s=15),
    "kill": lambda monkey, i: kill_worker_host(monkey, busiest(monkey)),
}


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fault", sorted(REPEATED))
def test_each_fault_repeated_on_three_worker_hosts_leaves_the_outputs_exact(tmp_path: Path, fault: str) -> None:
    with running_bed(tmp_path, workers=3) as bed, pipeline(tmp_path, bed, 80_000) as monkey:
        exact(monkey, [checked(REPEATED[fault](monkey, i)) for i in range(4)])
