"""A real Spark standalone cluster for tests: a master and workers started with the ``spark-class``
script PySpark ships, each its own JVM, stopped (SIGTERM, then SIGKILL) when the block ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

__all__ = ["Cluster", "standalone_cluster", "spark_class", "master_command", "worker_command", "spark_env"]


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def spark_env(host: str) -> dict[str, str]:
    """The environment of a Spark process bound to ``host`` (its JVMs in the foreground, its Python
    workers on this interpreter)."""
    return {**os.environ, "SPARK_LOCAL_IP": host, "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}


def master_command(host: str, port: int, ui_port: int) -> list[str]:
    return [str(spark_class()), "org.apache.spark.deploy.master.Master", "--host", host, "--port", str(port),
            "--webui-port", str(ui_port)]


def worker_command(master_url: str, host: str, cores: int, memory: str, ui_port: int, work_dir: Path) -> list[str]:
    return [str(spark_class()), "org.apache.spark.deploy.worker.Worker", master_url, "--host", host,
            "--cores", str(cores), "--memory", memory, "--webui-port", str(ui_port), "--work-dir", str(work_dir)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    url: str
    ui_port: int
    env: dict[str, str]
    cores: int
    memory: str
    logs: Path | None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            state = json.load(r)
        return sum(w["state"] == "ALIVE" for w in state["workers"])

    def start_worker(self) -> subprocess.Popen[bytes]:
        """One more worker JVM (in its own process group, with the executors it will launch)."""
        i = len(self.workers)
        out = open(self.logs / f"worker{i}.log", "wb") if self.logs else subprocess.DEVNULL
        worker = subprocess.Popen(worker_command(self.url, "127.0.0.1", self.cores, self.memory, _free_port(),
                                                 self.logs or Path("/tmp")),
                                  env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """SIGKILL a worker JVM with its executor and Python workers: a machine lost."""
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()

    def wait_for_workers(self, count: int, timeout_s: float = 90) -> None:
        deadline = time.time() + timeout_s
        while self.alive_workers() < count:
            if time.time() > deadline:
                raise RuntimeError(f"only {self.alive_workers()} of {count} Spark workers registered")
            time.sleep(0.5)


@contextmanager
def standalone_cluster(workers: int = 1, cores: int = 1, memory: str = "1g",
                       logs: Path | None = None) -> Iterator[Cluster]:
    env = spark_env("127.0.0.1")
    port, ui = _free_port(), _free_port()
    out = (lambda name: open(logs / f"{name}.log", "wb")) if logs else (lambda name: subprocess.DEVNULL)
    master = subprocess.Popen(master_command("127.0.0.1", port, ui), env=env, stdout=out("master"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    cluster = Cluster(f"spark://127.0.0.1:{port}", ui, env, cores, memory, logs)
    try:
        deadline = time.time() + 90
        while True:
            try:
                cluster.alive_workers()
                break
            except OSError:
                if master.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the Spark master did not start (exit {master.poll()})")
                time.sleep(0.5)
        for _ in range(workers):
            cluster.start_worker()
        cluster.wait_for_workers(workers)
        yield cluster
    finally:
        procs = [master, *cluster.workers]
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
