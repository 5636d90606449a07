"""``/metrics`` in Prometheus's text format, served by the running driver (``run(..., metrics_port=N)``).

Every gauge is built, at each scrape, from the latest ``status`` the driver's monitor thread took
(at most a second old), so the metrics and ``headrace status`` never disagree. Watermarks are in
seconds since the epoch (the end of time is ``+Inf``; a stage without a watermark yet has no sample).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..model import BEGINNING_OF_TIME, END_OF_TIME

__all__ = ["StatusCollector", "serve_metrics"]

LABELS = ["stage", "kind"]


def _seconds(ms: int) -> float | None:
    if ms >= END_OF_TIME:
        return math.inf
    return None if ms <= BEGINNING_OF_TIME else ms / 1000


class StatusCollector:
    """A prometheus-client collector over ``snapshot()``, a status report (or None before the first)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any] | None]):
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        status = self.snapshot()
        if status is None:
            return
        stages = status["stages"]

        def gauge(name: str, text: str, value: Callable[[dict[str, Any]], float | None]) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"headrace_{name}", text, labels=LABELS)
            for stage_name, s in stages.items():
                v = value(s)
                if v is not None:
                    family.add_metric([stage_name, s["kind"]], float(v))
            return family

        def counter(name: str, text: str, field: str) -> CounterMetricFamily:
            family = CounterMetricFamily(f"headrace_{name}", text, labels=LABELS)
            for stage_name, s in stages.items():
                family.add_metric([stage_name, s["kind"]], float(s[field]))
            return family

        def ms(field: str) -> Callable[[dict[str, Any]], float | None]:
            return lambda s: None if s[field] is None else s[field] / 1000

        yield gauge("input_watermark_seconds", "Input low watermark, from the journal", lambda s: _seconds(
            s["input_watermark"]))
        yield gauge("output_watermark_seconds", "Output low watermark, from the journal", lambda s: _seconds(
            s["output_watermark"]))
        yield gauge("watermark_lag_seconds", "Output low watermark behind the wall clock", ms("watermark_lag_ms"))
        yield gauge("producer_lag_seconds", "Output low watermark behind the lowest upstream stage's",
                    ms("producer_lag_ms"))
        yield gauge("records_per_second", "Records processed (injectors: published) per second, recently",
                    lambda s: s["records_per_s"])
        yield gauge("backlog_records", "Committed input records not yet read", lambda s: s["backlog_records"])
        yield gauge("backlog_batches", "Committed producer batches not yet read", lambda s: s["backlog_batches"])
        yield gauge("alert", "1 while a lag alert is active", lambda s: None if s["alert_lag_ms"] is None else
                    float(s["alert"] is not None))
        yield gauge("commit_interval_mean_seconds", "Mean time between journaled commits of a producer, recently",
                    lambda s: None if s["commit_interval_ms"]["mean"] is None else s["commit_interval_ms"]["mean"] / 1000)
        yield gauge("commit_interval_max_seconds", "Longest time between journaled commits of a producer, recently",
                    lambda s: None if s["commit_interval_ms"]["max"] is None else s["commit_interval_ms"]["max"] / 1000)
        yield counter("records", "Records processed (injectors: published)", "records")
        yield counter("batches", "Commits journaled", "batches")
        yield counter("late_dropped", "Late records dropped", "late_dropped")
        yield counter("late_delivered", "Late records delivered", "late_delivered")
        yield counter("dead_letters", "Records and timers sent to the dead-letter stream", "dead_letters")


def serve_metrics(port: int, snapshot: Callable[[], dict[str, Any] | None], addr: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread; returns the server (``server_port``,
    ``shutdown()``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(snapshot))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
