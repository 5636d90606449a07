"""A real PostgreSQL server for the tests, started from the machine's binaries in a temporary
directory (Debian's ``postgresql`` package; ``.ci/run`` installs it when missing), one per test
session, with a fresh database per test. ``HEADRACE_TEST_POSTGRES=postgresql://…/postgres`` uses a
server that is already running instead. The network test bed (tests/netbed) starts one inside a
network namespace, listening on that host's address (``address``, ``prefix``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

__all__ = ["PostgresServer", "find_postgres_bin"]


def find_postgres_bin() -> Path | None:
    """The directory holding initdb and pg_ctl (on PATH, or Debian's /usr/lib/postgresql/<v>/bin)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.path.exists(f"{candidate}/initdb") and os.path.exists(f"{candidate}/pg_ctl"):
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """``address``: where it listens (clients on that address's subnet are trusted too); ``port``:
    a fixed one (else a free one); ``prefix``: put before every server command, e.g.
    ``["ip", "netns", "exec", name]`` to start it on a host of the network test bed."""

    def __init__(self, admin_url: str | None = None, *, address: str = "127.0.0.1", port: int | None = None,
                 prefix: tuple[str, ...] = ()):
        self.admin_url = admin_url
        self.address, self.port, self.prefix = address, port, prefix
        self.folder: str | None = None
        self.bin: Path | None = None

    def start(self) -> "PostgresServer":
        if self.admin_url:
            return self
        self.bin = find_postgres_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) were not found; "
                               "install them with: apt-get install -y postgresql")
        self.folder = tempfile.mkdtemp(prefix="headrace-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self.port = self.port or _free_port()
        self._run("initdb", "-D", f"{self.folder}/data", "-U", "headrace", "-A", "trust", "-E", "UTF8", "--no-sync")
        if self.address != "127.0.0.1":
            with open(f"{self.folder}/data/pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")
        self._run("pg_ctl", "-D", f"{self.folder}/data", "-l", f"{self.folder}/server.log", "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.folder} -c listen_addresses={self.address} -c max_connections=300 "
                  "-c log_line_prefix='%m [%p] %d %a '", "start")
        self.admin_url = f"postgresql://headrace@{self.address}:{self.port}/postgres"
        return self

    def _run(self, tool: str, *args: str) -> None:
        assert self.bin is not None and self.folder is not None
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: run it as the postgres user
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*self.prefix, *command]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            log = Path(f"{self.folder}/server.log")
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip()}\n"
                               f"{log.read_text() if log.exists() else ''}")

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        assert self.admin_url is not None
        name = f"headrace_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.local_url(self.admin_url), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"

    @property
    def log(self) -> Path:
        """The server's log (a database with ``log_statement = 'all'`` logs there each statement it
        runs, prefixed with ``<time> [<backend pid>] <database> <application_name>``)."""
        assert self.folder is not None, "a server this process did not start keeps its log elsewhere"
        return Path(f"{self.folder}/server.log")

    def local_url(self, database_url: str) -> str:
        """The same database through the server's Unix socket, when this process started the server:
        reachable from this machine's own network namespace whatever address the server listens on."""
        if self.folder is None:
            return database_url
        return f"postgresql://headrace@/{database_url.rsplit('/', 1)[-1]}?host={self.folder}&port={self.port}"

    def stop(self) -> None:
        if self.folder is None:
            return
        try:
            self._run("pg_ctl", "-D", f"{self.folder}/data", "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
