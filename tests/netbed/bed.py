"""Hosts on a network, for tests: each host a Linux network namespace with one address, wired
to a bridge by a veth pair; faults are applied to those links.

    namespace <tag>-lan:  bridge br0 ── port p-<host> ═╗ (veth pair)
    namespace <tag>-<host>:                  eth0 ═════╝ 10.213.0.<n>/24, and its own lo

The addresses come from a private range (RFC 1918) and exist only inside the bed's namespaces:
nothing is added to this machine's own network, and no host of the bed reaches it. Everything the
bed starts runs under ``ip netns exec``; ``close()`` kills every process left in its namespaces
and deletes them (with them the veth pairs and the bridge). It needs root and iproute2 (``ip``,
``tc``): ``why_no_bed()`` says what is missing.

Faults: ``cut``/``mend`` take a host's port on the bridge down and up again (the host's own
stack still sees its link up, as when a cable or a switch fails further away); ``throttle``
limits both directions of a host's link with ``tc`` ``htb`` (this kernel has no ``netem``: delay
comes from the queue a rate limit builds); ``kill`` SIGKILLs every process of a host.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Mapping, Sequence

__all__ = ["Host", "NetBed", "net_bed", "why_no_bed", "BED_HINT"]

PREFIX = "hrbed"
SUBNET = "10.213.0"  # a private range; its addresses exist only inside the bed's namespaces
BED_HINT = ("run the tests as root on a machine with iproute2 (apt-get install -y iproute2), as CI does: "
            "sudo scripts/test tests/netbed")
_beds = itertools.count()


def why_no_bed() -> str | None:
    """Why this process cannot make a bed, or None when it can."""
    if os.geteuid() != 0:
        return "the network test bed makes network namespaces, a bridge and veth pairs, which needs root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"the network test bed needs iproute2's {' and '.join(missing)}, not found on PATH"
    return None


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str

    @property
    def port(self) -> str:
        """Its port on the bridge: the veth end in the bed's lan namespace."""
        return f"p-{self.name}"[:15]


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


class NetBed:
    """``hosts`` by name; ``spawn``/``run`` a command on one; faults; ``close()`` removes it all."""

    def __init__(self, names: Sequence[str]):
        self.tag = f"{PREFIX}{os.getpid()}-{next(_beds)}"
        self.lan = f"{self.tag}-lan"
        self.hosts = {name: Host(name, f"{self.tag}-{name}", f"{SUBNET}.{10 + i}") for i, name in enumerate(names)}
        self.processes: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        _remove_orphans()
        self._add_netns(self.lan)
        _ip("-n", self.lan, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.lan, "link", "set", "br0", "up")
        for host in self.hosts.values():
            self._add_netns(host.netns)
            _ip("link", "add", host.port, "netns", self.lan, "type", "veth", "peer", "name", "eth0",
                "netns", host.netns)
            _ip("-n", self.lan, "link", "set", host.port, "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    # -- processes ------------------------------------------------------------------------------

    def prefix(self, host: Host) -> tuple[str, ...]:
        """What runs a command on ``host``."""
        return ("ip", "netns", "exec", host.netns)

    def spawn(self, host: Host, command: Sequence[str], *, env: Mapping[str, str] | None = None,
              out: IO[bytes] | IO[str] | int = subprocess.DEVNULL, cwd: Path | None = None,
              text: bool = False) -> subprocess.Popen:
        """Start ``command`` on ``host`` in a process group of its own."""
        process = subprocess.Popen([*self.prefix(host), *command], env=env, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=cwd, text=text, start_new_session=True)
        self.processes.append(process)
        return process

    def run(self, host: Host, command: Sequence[str], timeout_s: float = 60) -> str:
        """Run ``command`` on ``host`` to its end; its output."""
        done = subprocess.run([*self.prefix(host), *command], capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} on {host.name} failed ({done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
        return done.stdout

    def pids(self, host: Host) -> list[int]:
        """Every process running on ``host`` (in its network namespace)."""
        return [int(p) for p in _ip("netns", "pids", host.netns).split()]

    def host_of(self, pid: int) -> Host | None:
        """The host whose network namespace process ``pid`` runs in."""
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None
        return next((h for h in self.hosts.values() if os.stat(f"/run/netns/{h.netns}").st_ino == inode), None)

    # -- faults -----------------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        """Take the host's port on the bridge down: nothing reaches it, nothing it sends arrives."""
        _ip("-n", self.lan, "link", "set", host.port, "down")

    def mend(self, host: Host) -> None:
        _ip("-n", self.lan, "link", "set", host.port, "up")

    def throttle(self, host: Host, rate: str) -> None:
        """Limit the host's link to ``rate`` (tc's units, e.g. ``2mbit``) both ways: to the host on
        its bridge port, from it on its eth0."""
        for netns, dev in ((self.lan, host.port), (host.netns, "eth0")):
            _run(["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1"])
            _run(["tc", "-n", netns, "class", "replace", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                  "rate", rate])

    def throttled(self, host: Host) -> dict[str, int]:
        """What the rate limit on the host's link did, summed over both ways: ``bytes`` and ``packets``
        it passed, ``overlimits`` (packets it held back) and ``drops``."""
        totals = {"bytes": 0, "packets": 0, "overlimits": 0, "drops": 0}
        for netns, dev in ((self.lan, host.port), (host.netns, "eth0")):
            (qdisc,) = [q for q in json.loads(_run(["tc", "-s", "-j", "-n", netns, "qdisc", "show", "dev", dev]))
                        if q.get("root")]
            for name in totals:
                totals[name] += int(qdisc[name])
        return totals

    def traffic(self, host: Host) -> int:
        """Bytes through the host's port on the bridge so far, both ways."""
        (link,) = json.loads(_ip("-n", self.lan, "-s", "-j", "link", "show", "dev", host.port))
        return int(link["stats64"]["rx"]["bytes"]) + int(link["stats64"]["tx"]["bytes"])

    def unthrottle(self, host: Host) -> None:
        for netns, dev in ((self.lan, host.port), (host.netns, "eth0")):
            _run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"])

    def kill(self, host: Host) -> list[int]:
        """SIGKILL every process on ``host``, as a machine that lost its power; the pids it killed."""
        return _kill_all(self.pids(host))

    def close(self) -> None:
        """Kill what runs on the bed's hosts and delete its namespaces (its links go with them)."""
        errors = []
        for netns in reversed(self._made):
            try:
                _kill_all([int(p) for p in _ip("netns", "pids", netns).split()])
                _ip("netns", "del", netns)
            except RuntimeError as exc:
                errors.append(str(exc))
        self._made.clear()
        for process in self.processes:
            process.wait()
        if errors:
            raise RuntimeError("the network test bed was not removed whole: " + "; ".join(errors))


def _kill_all(pids: list[int], timeout_s: float = 10) -> list[int]:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + timeout_s
    while any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids):
        if time.time() > deadline:
            raise RuntimeError(f"processes {pids} outlived SIGKILL for {timeout_s} s")
        time.sleep(0.05)
    return pids


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _remove_orphans() -> None:
    """Namespaces of beds whose test process died without removing them (killed itself)."""
    for netns in _ip("netns", "list").split("\n"):
        name = netns.split(" ")[0]
        owner = name[len(PREFIX):].split("-", 1)[0]
        if name.startswith(PREFIX) and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            _kill_all([int(p) for p in _ip("netns", "pids", name).split()])
            _ip("netns", "del", name)


@contextmanager
def net_bed(names: Sequence[str]) -> Iterator[NetBed]:
    bed = NetBed(names)
    try:
        yield bed
    finally:
        bed.close()
