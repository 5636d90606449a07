"""A cluster on the network test bed (bed.py): a Spark standalone master, two or more Spark
workers and a PostgreSQL server, each on a host of its own, and a host for the driver.

Each Spark process is started from PySpark's ``spark-class`` bound to its host's address, and the
PostgreSQL server from the machine's binaries listening on the store host's address; the test
itself reaches the server through its Unix socket (``local_url``), which no fault of the network
touches, and everything else through the network.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..cluster.standalone import master_command, spark_env, worker_command
from ..postgres_server import PostgresServer
from .bed import Host, NetBed, net_bed

__all__ = ["BedCluster", "cluster_bed"]

MASTER_PORT, MASTER_UI_PORT, WORKER_UI_PORT, POSTGRES_PORT = 7077, 8080, 8081, 5432
PROBE = Path(__file__).with_name("probe.py")
FAILPOINT_MS, FAILPOINT_STEPS = 50, ("begin", "before_commit")


@dataclass
class BedCluster:
    net: NetBed
    postgres: PostgresServer
    logs: Path
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # worker host -> its Spark worker

    @property
    def url(self) -> str:
        return f"spark://{self.net['master'].address}:{MASTER_PORT}"

    @property
    def driver_host(self) -> Host:
        return self.net["driver"]

    def worker_hosts(self) -> list[Host]:
        return [h for name, h in self.net.hosts.items() if name.startswith("worker")]

    @property
    def marks(self) -> Path:
        """Where the workers' failpoints mark the processes asleep in them: ``<step>/<pid>``."""
        return self.logs / "marks"

    def start_worker(self, host: Host) -> None:
        """A Spark worker JVM on ``host`` (one core), which launches its executors there. Their
        continuous workers sleep briefly at two points of every commit, marked (``marks``), so
        that a test can cut a link at a known point: just before the commit's transaction
        begins, and inside it with every statement sent but its COMMIT."""
        work = self.logs / host.name
        work.mkdir(exist_ok=True)
        failpoints = ";".join(f"{step}=sleep:{FAILPOINT_MS}:{self.marks / step}" for step in FAILPOINT_STEPS)
        for step in FAILPOINT_STEPS:
            (self.marks / step).mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{host.name}.log", "ab") as log:
            self.workers[host.name] = self.net.spawn(
                host, worker_command(self.url, host.address, 1, "1g", WORKER_UI_PORT, work),
                env={**spark_env(host.address), "HEADRACE_FAILPOINTS": failpoints}, out=log)

    def kill_worker(self, host: Host) -> list[int]:
        """SIGKILL the worker's whole process group (the JVM, its executor, their Python workers): the
        host is lost. Returns the pids that ran on the host."""
        worker = self.workers.pop(host.name)
        running = self.net.pids(host)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        return running

    def probe(self, host: Host, *args: str) -> object:
        return json.loads(self.net.run(host, [sys.executable, str(PROBE), *args]).strip().splitlines()[-1])

    def alive_workers(self) -> int:
        return int(self.probe(self.driver_host, "workers",  # type: ignore[call-overload]
                              f"http://{self.net['master'].address}:{MASTER_UI_PORT}/json/"))

    def wait_for_workers(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.time() + timeout_s
        while True:
            try:
                if self.alive_workers() >= count:
                    return
            except RuntimeError:
                pass  # the master is not serving yet
            if time.time() > deadline:
                raise RuntimeError(f"fewer than {count} Spark workers registered with the master in {timeout_s} s; "
                                   f"see the logs in {self.logs}")
            time.sleep(1)

    def database(self) -> tuple[str, str]:
        """A fresh database: its URL over the bed's network (for the driver and the workers), and
        through the server's Unix socket (for the test)."""
        url = self.postgres.new_database()
        return url, self.postgres.local_url(url)


@contextmanager
def cluster_bed(logs: Path, workers: int = 2) -> Iterator[BedCluster]:
    """The bed with its services running; all of it stopped and removed when the block ends."""
    names = ["master", "store", "driver", *(f"worker{i}" for i in range(1, workers + 1))]
    with net_bed(names) as net:
        store = net["store"]
        postgres = PostgresServer(address=store.address, port=POSTGRES_PORT, prefix=net.prefix(store))
        cluster = BedCluster(net, postgres, logs)
        try:
            postgres.start()
            master = net["master"]
            with open(logs / "master.log", "ab") as log:
                net.spawn(master, master_command(master.address, MASTER_PORT, MASTER_UI_PORT),
                          env=spark_env(master.address), out=log)
            for host in cluster.worker_hosts():
                cluster.start_worker(host)
            cluster.wait_for_workers(workers)
            yield cluster
        finally:
            postgres.stop()
