"""``status`` as text for a terminal (the CLI's ``headrace status`` without ``--json``)."""

from __future__ import annotations

import time
from typing import Any

from ..model import BEGINNING_OF_TIME, END_OF_TIME

__all__ = ["show_mark", "status_text"]


def show_mark(ms: int) -> str:
    if ms >= END_OF_TIME:
        return "end-of-time"
    if ms <= BEGINNING_OF_TIME:
        return "beginning"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value / 1000:.1f}s"


def status_text(status: dict[str, Any]) -> str:
    lines = [f"headrace status of {status['store']} at {show_mark(status['now_ms'])}"]
    for topology in status["topologies"]:
        lines.append(f"topology {topology['name']} ({topology['mode']} mode)"
                     + (f"  last error: {topology['last_error']['message']}" if topology["last_error"] else ""))
    lines.append(f"{'stage':<28} {'output watermark':<26} {'lag':>8} {'behind':>8} {'rec/s':>9} {'backlog':>8} "
                 f"{'batches':>8} {'late d/d':>9} {'dead':>5}  owners")
    for name, s in status["stages"].items():
        rate = "-" if s["records_per_s"] is None else f"{s['records_per_s']:.0f}"
        live = sum(o["live"] for o in s["owners"])
        owners = f"{live}/{len(s['owners'])} leased" if s["owners"] else "-"
        lines.append(f"{name:<28} {show_mark(s['output_watermark']):<26} {_ms(s['watermark_lag_ms']):>8} "
                     f"{_ms(s['producer_lag_ms']):>8} {rate:>9} {s['backlog_records']:>8} {s['batches']:>8} "
                     f"{s['late_dropped']:>4}/{s['late_delivered']:<4} {s['dead_letters']:>5}  {owners}")
        if s["last_error"]:
            lines.append(f"  last error: {s['last_error']['message']}")
    for d in status.get("rebalanced", [])[:5]:
        what = (f"moved {d['computation']}/{d['shard']} from {d['source']} to {d['target']}" if d["kind"] == "move"
                else f"rescaled {d['computation']} from {d['old']} to {d['new']} intervals")
        lines.append(f"rebalanced at {show_mark(d['at'])}: {what}")
    for alert in status["alerts"]:
        lines.append(f"ALERT {alert['stage']}: watermark {_ms(alert['lag_ms'])} behind the wall clock "
                     f"(alert_lag_ms={alert['threshold_ms']}) since {show_mark(alert['raised_at'])}")
    return "\n".join(lines)
