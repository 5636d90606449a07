"""The three-stage oracle pipeline in continuous mode on a cluster of network namespaces (a Spark
master, two workers, the PostgreSQL store and the driver, each a host with its own address),
with faults on its links and hosts; its outputs must equal the oracle.

CI runs the three faults in sequence in one run; ``scripts/test --long tests/netbed`` runs each on
its own, longer, with more of them.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from ..chaos.test_chaos import Divergence
from .bed import BED_HINT, why_no_bed
from .cluster import BedCluster, cluster_bed
from .faults import BedMonkey, cut_worker_link, every_worker_holds_intervals, kill_worker_host, throttle_store_link


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[BedCluster]:
    why_not = why_no_bed()
    if why_not is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why_not}; CI runs as root and must run the network test bed. Hint: {BED_HINT}",
                        pytrace=False)
        pytest.skip(f"{why_not}. Hint: {BED_HINT}")
    with cluster_bed(tmp_path) as running:
        yield running


def test_a_cut_a_slow_store_link_and_a_killed_worker_host_leave_the_outputs_exact(
        tmp_path: Path, bed: BedCluster) -> None:
    monkey = BedMonkey(tmp_path, bed, 24_000)
    w1, w2 = bed.worker_hosts()
    try:
        monkey.start_driver()
        every_worker_holds_intervals(monkey, [w1, w2])
        cut = cut_worker_link(monkey, w1)
        print(cut)
        slow = throttle_store_link(monkey)
        print(slow)
        every_worker_holds_intervals(monkey, [w2])
        killed = kill_worker_host(monkey, w2)
        print(killed)
        found = monkey.divergence_after_drain(600)
    finally:
        if monkey.driver is not None and monkey.driver.poll() is None:
            os.killpg(monkey.driver.pid, signal.SIGKILL)
    assert found == Divergence()
