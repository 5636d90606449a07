"""Spark's web UI of a session headrace creates on a local master listens on loopback only
(spark/session.py ``ui_bind_address``): Spark 4.3 binds it to every interface otherwise."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlparse
from urllib.request import urlopen

from headrace.spark.session import ui_url


def listening(port: int) -> set[str]:
    """The local addresses a TCP socket listens on at ``port`` (from /proc/net/tcp and tcp6)."""
    found: set[str] = set()
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                    raw = bytes.fromhex(address)
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))  # per 32-bit word, host order
                    ip = ipaddress.ip_address(raw)
                    mapped = getattr(ip, "ipv4_mapped", None)  # Java listens on IPv6 sockets: ::ffff:127.0.0.1
                    found.add(str(mapped or ip))
    return found


def test_the_spark_ui_of_a_local_session_listens_on_loopback_only(spark: Any) -> None:
    url = ui_url(spark)
    assert url is not None
    port = urlparse(url).port
    assert port is not None and listening(port) == {"127.0.0.1"}
    with urlopen(f"http://127.0.0.1:{port}/api/v1/applications", timeout=30) as response:
        assert response.status == 200  # reachable where it listens
