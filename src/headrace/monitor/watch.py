"""The running driver's monitor thread: once a second it takes the store's status, keeps it for
the metrics endpoint, writes a sample of every stage (the history that records/s and the
dashboard read) and raises or clears lag alerts. Monitoring never stops a pipeline: a failed
round is logged and the next one runs."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any, TextIO

from ..errors import OptionError
from ..store import Store, open_store
from ..store.monitoring import Sample
from .events import ALERT, CLEARED, active_alerts, wall_ms
from .status import status_of

__all__ = ["Watcher", "HISTORY_MS", "check_metrics_port", "announce_metrics"]

HISTORY_MS = 15 * 60_000  # samples older than this are deleted
log = logging.getLogger("headrace.monitor")


def check_metrics_port(port: object) -> int | None:
    """``None`` (no endpoint), or a TCP port; 0 picks a free one."""
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OptionError("metrics_port must be a TCP port number (0 picks a free one) or None", got=port,
                          hint="e.g. metrics_port=9108, then scrape http://<driver host>:9108/metrics")
    return port


def announce_metrics(watcher: "Watcher", progress: TextIO | None) -> None:
    if watcher.metrics_url is not None and progress is not None:
        print(f"headrace: Prometheus metrics at {watcher.metrics_url}", file=progress, flush=True)


class Watcher:
    """``start()``, then ``stop()``; ``latest`` is the last status taken (None before the first).
    With a ``metrics_port``, it also serves ``/metrics`` (``metrics_url``) from ``latest``."""

    def __init__(self, url: str, every_s: float = 1.0, metrics_port: int | None = None):
        self.url, self.every_s = url, every_s
        self.metrics_port = check_metrics_port(metrics_port)
        self.metrics_url: str | None = None
        self._server: Any = None
        self.latest: dict[str, Any] | None = None
        self.failure: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headrace-monitor", daemon=True)
        self._trimmed = 0

    def start(self) -> "Watcher":
        if self.metrics_port is not None:
            from .metrics import serve_metrics

            self._server = serve_metrics(self.metrics_port, lambda: self.latest)
            self.metrics_port = int(self._server.server_port)
            self.metrics_url = f"http://{socket.gethostname()}:{self.metrics_port}/metrics"
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _run(self) -> None:
        store = open_store(self.url)
        try:
            while True:
                began = time.monotonic()
                try:
                    self.round(store)
                except Exception as exc:  # a store hiccup: log it, try again next round
                    self.failure = exc
                    log.warning("headrace monitor round failed: %s: %s", type(exc).__name__, exc)
                # a round that takes long (status reads every interval) spaces the rounds out, so
                # that the monitor never takes more than a quarter of the driver's time or the store's
                if self._stopping.wait(max(self.every_s, 3 * (time.monotonic() - began))):
                    return
        finally:
            store.close()

    def round(self, store: Store) -> dict[str, Any]:
        """One round: status, samples, alerts."""
        now = wall_ms()
        status = status_of(store, now)
        store.add_samples([Sample(n, now, s["records"], s["input_watermark"], s["output_watermark"],
                                  s["backlog_records"]) for n, s in status["stages"].items()])
        if now - self._trimmed > 60_000:
            store.trim_samples(now - HISTORY_MS)
            self._trimmed = now
        if self.check_alerts(store, status, now):
            status = status_of(store, now)
        self.latest = status
        return status

    def check_alerts(self, store: Store, status: dict[str, Any], now: int) -> bool:
        """Raise an alert for each stage whose watermark lag passed its ``alert_lag_ms``, clear it once
        back under; True if any changed."""
        active = active_alerts(store)
        changed = False
        for name, stage in status["stages"].items():
            threshold, lag = stage.get("alert_lag_ms"), stage["watermark_lag_ms"]
            if threshold is None or lag is None:
                continue
            detail = {"threshold_ms": threshold, "lag_ms": lag, "output_watermark": stage["output_watermark"]}
            if lag > threshold and name not in active:
                log.warning("headrace alert: %s's low watermark is %d ms behind the wall clock (alert_lag_ms=%d)",
                            name, lag, threshold)
                store.add_event(name, ALERT, now, json.dumps(detail))
                changed = True
            elif lag <= threshold and name in active:
                log.warning("headrace alert cleared: %s's low watermark is %d ms behind the wall clock "
                            "(alert_lag_ms=%d)", name, lag, threshold)
                store.add_event(name, CLEARED, now, json.dumps(detail))
                changed = True
        return changed
