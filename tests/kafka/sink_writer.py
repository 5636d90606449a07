"""One Kafka sink writer as a process, for the tests that pause or kill it:
``python sink_writer.py STORE_URL TOPIC BOOTSTRAP LEASE_MS`` writes what is journaled until
stdin closes, printing ``opened`` once it holds the lease and has fenced its predecessor."""

from __future__ import annotations

import sys
import threading

from headrace.errors import HeadraceError
from headrace.spark.kafka_sink import KafkaSinkWriter
from headrace.sinkspec import parse_sink

TOPOLOGY, STREAM = "sinktest", "things"


def spec(topic: str, bootstrap: str, lease_ms: int):  # type: ignore[no-untyped-def]
    return parse_sink(STREAM, "out", {"kafka": topic, "bootstrap_servers": bootstrap, "lease_ms": lease_ms})


if __name__ == "__main__":
    store, topic, bootstrap, lease_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    writer = KafkaSinkWriter(TOPOLOGY, spec(topic, bootstrap, lease_ms), store).open()
    print("opened", flush=True)
    try:
        while not closed.is_set():
            if not writer.write_once(refresh=True):
                closed.wait(0.01)
    except HeadraceError as exc:
        print(exc, file=sys.stderr, flush=True)
        sys.exit(3)
    writer.close()
