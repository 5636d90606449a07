"""``status``: every stage of every topology in a store, computed from the store alone (docs/monitoring.md).

It reads committed rows only (the journal, segment counts, shard rows, positions, counters, the
samples the running driver writes, events), so it answers the same from any machine, while the
pipeline runs and after it stops.
"""

from __future__ import annotations

import json
from typing import Any

from ..names import CONTINUOUS, REBALANCED, interval, meta
from ..model import BEGINNING_OF_TIME, END_OF_TIME
from ..store import Store, open_store
from ..store.monitoring import WHOLE_COMPUTATION
from .events import active_alerts, last_errors, wall_ms
from .graph import recorded_graphs

__all__ = ["status", "status_of", "progress_of", "RECENT_MS"]

RECENT_MS = 10_000  # "recent": records/s and commit intervals are measured over this window


def status(store: str, now_ms: int | None = None) -> dict[str, Any]:
    """Every injector and computation in ``store``: topology, watermarks and lags, throughput,
    backlog, counters, owners, last error, and the active lag alerts. JSON-serialisable."""
    db = open_store(store, read_only=True)
    try:
        return status_of(db, now_ms)
    finally:
        db.close()


def status_of(db: Store, now_ms: int | None = None) -> dict[str, Any]:
    """``status`` on an open store."""
    now = wall_ms() if now_ms is None else now_ms
    alerts, errors = active_alerts(db), last_errors(db)
    workers = _workers(db)
    stages: dict[str, dict[str, Any]] = {}
    topologies = []
    for graph in recorded_graphs(db):
        names = [*graph["injectors"], *graph["computations"]]
        topologies.append({"name": graph["name"], "mode": graph["mode"], "stages": names,
                           "streams": _streams(graph), "last_error": errors.get(graph["name"])})
        for name, injector in graph["injectors"].items():
            stages[name] = _injector(db, graph, name, injector, now)
        for name, spec in graph["computations"].items():
            stages[name] = _computation(db, graph["mode"], graph["bus"], name, spec, now, workers)
    unrecorded = [name for name in db.computations() if name not in stages]  # e.g. the harness's
    modes = db.computation_modes(unrecorded)
    for name, shards in db.computations().items():
        if name not in stages:
            mode = modes[name]
            spec = {"inputs": [], "outputs": [], "upstream": [], "shards": shards, "codec": None,
                    "alert_lag_ms": None}
            stages[name] = _computation(db, mode, {}, name, spec, now, workers)
    for stage in stages.values():
        stage["producer_lag_ms"] = _producer_lag(stage, stages)
        stage["last_error"] = errors.get(stage["name"])
        stage["alert"] = alerts.get(stage["name"])
    return {"store": db.shown_url, "now_ms": now, "recent_ms": RECENT_MS, "topologies": topologies,
            "stages": stages, "alerts": list(alerts.values()), "rebalanced": rebalanced(db)}


def rebalanced(db: Store, last: int = 20) -> list[dict[str, Any]]:
    """The rebalancer's last decisions, newest first: moves of an interval from one worker to
    another, and rescales of a computation (docs/architecture.md §4.2, "Rebalancing")."""
    events = db.events(kinds=[REBALANCED])[-last:]
    return [{"at": e.at, **json.loads(e.detail)} for e in reversed(events)]


def progress_of(db: Store, name: str, now: int | None = None) -> dict[str, int | None]:
    """The few numbers of computation ``name`` that Spark's progress events carry (docs/monitoring.md,
    "In Spark's progress events"): cheap enough to read every second. The watermarks are read
    before the counters, so counters read at the end of time are final."""
    journal = db.latest_batch(name)
    inp, out = (journal.input_watermark, journal.output_watermark) if journal else (BEGINNING_OF_TIME,) * 2
    return {"watermark": inp, "output_watermark": out,
            "watermark_lag_ms": wall_lag(wall_ms() if now is None else now, out), **_counts(db.counters(name))}


def _counts(counters: dict[str, int]) -> dict[str, int]:
    return {"records": counters.get("records", 0), "late_dropped": counters.get("late_dropped", 0),
            "late_delivered": counters.get("late_delivered", 0), "dead_letters": counters.get("dead_lettered", 0)}


def wall_lag(now: int, watermark: int) -> int | None:
    """How far a low watermark is behind the wall clock: 0 at the end of time, None before any."""
    if watermark >= END_OF_TIME:
        return 0
    if watermark <= BEGINNING_OF_TIME:
        return None
    return max(0, now - watermark)


def _producer_lag(stage: dict[str, Any], stages: dict[str, dict[str, Any]]) -> int | None:
    """How far the stage's output watermark is behind the lowest of its upstream stages' (None
    when either has none yet, or when the upstream reached the end of time and the stage has not)."""
    ups = [stages[u]["output_watermark"] for u in stage["upstream"] if u in stages]
    mine = stage["output_watermark"]
    if mine >= END_OF_TIME:
        return 0
    if not ups or min(ups) <= BEGINNING_OF_TIME or min(ups) >= END_OF_TIME or mine <= BEGINNING_OF_TIME:
        return None
    return max(0, min(ups) - mine)


def _streams(graph: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Per stream: the stages that write it and the computations that read it (the graph's edges)."""
    out: dict[str, dict[str, list[str]]] = {s: {"writers": [], "readers": []} for s in graph["bus"]}
    for name, injector in graph["injectors"].items():
        out[injector["stream"]]["writers"].append(name)
    for name, spec in graph["computations"].items():
        for s in spec["outputs"]:
            out.setdefault(s, {"writers": [], "readers": []})["writers"].append(name)
        for s in spec["inputs"]:
            out[s]["readers"].append(name)
    return out


def _base(name: str, kind: str, inputs: list[str], outputs: list[str], upstream: list[str],
          input_wm: int, output_wm: int, now: int) -> dict[str, Any]:
    return {"name": name, "kind": kind, "inputs": inputs, "outputs": outputs, "upstream": upstream,
            "input_watermark": input_wm, "output_watermark": output_wm,
            "watermark_lag_ms": wall_lag(now, output_wm)}


def _injector(db: Store, graph: dict[str, Any], name: str, injector: dict[str, Any], now: int) -> dict[str, Any]:
    parts: list[str] = injector["parts"]
    heads = db.latest_batches(parts)
    marks = [db.batch_info(p, heads[p]) if p in heads else None for p in parts]
    mark = min((m.output_watermark if m else BEGINNING_OF_TIME) for m in marks)
    stage = _base(name, "injector", [], [injector["stream"]], [], mark, mark, now)
    stage.update({
        "topology": graph["name"], "mode": graph["mode"], "batches": sum(heads.values()),
        "records": db.records_of(parts), "records_per_s": db.records_of(parts, now - RECENT_MS) * 1000 / RECENT_MS,
        "backlog_records": 0, "backlog_batches": 0, "late_dropped": 0, "late_delivered": 0, "dead_letters": 0,
        "counters": {}, "owners": [], "commit_interval_ms": _commit_intervals(db, parts, now),
        "alert_lag_ms": None, "parts": parts})
    return stage


def _computation(db: Store, mode: str, bus: dict[str, list[str]], name: str, spec: dict[str, Any], now: int,
                 workers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    shards = int(spec["shards"])
    journal = db.latest_batch(name)  # micro-batch: the driver's rows; continuous: the watermark authority's
    inp, out = (journal.input_watermark, journal.output_watermark) if journal else (BEGINNING_OF_TIME,) * 2
    parts = [interval(name, i) for i in range(shards)] if mode == CONTINUOUS else [name]
    heads = db.latest_batches(parts)
    counters = db.counters(name)
    backlog_records, backlog_batches = _backlog(db, name, mode, shards, bus, spec["inputs"])
    stage = _base(name, "computation", list(spec["inputs"]), list(spec["outputs"]), list(spec["upstream"]),
                  inp, out, now)
    stage.update({
        "mode": mode, "batches": sum(heads.values()), **_counts(counters),
        "records_per_s": _rate(db, name, now), "backlog_records": backlog_records, "backlog_batches": backlog_batches,
        "counters": counters,
        "owners": _owners(db, name, now, workers), "commit_interval_ms": _commit_intervals(db, parts, now),
        "codec": spec.get("codec"), "shards": shards, "alert_lag_ms": spec.get("alert_lag_ms")})
    return stage


def _backlog(db: Store, name: str, mode: str, shards: int, bus: dict[str, list[str]],
             inputs: list[str]) -> tuple[int, int]:
    """Committed input not yet read: records (and producer batches) journaled after the position of the
    interval that has read least of each producer, an upper bound that is exact when the intervals
    stand at one position, as they do once drained."""
    positions = db.all_positions(name)
    readers = range(shards) if mode == CONTINUOUS else [WHOLE_COMPUTATION]
    producers = sorted({p for s in inputs for p in bus.get(s, [])})
    heads = db.latest_batches(producers)
    read = {p: min(positions.get(r, {}).get(p, 0) for r in readers) for p in producers}
    # only journaled batches: a batch's segments are committed before its journal row makes them visible
    records = sum(db.records_between(s, p, read[p], heads.get(p, 0)) for s in inputs for p in bus.get(s, []))
    return records, sum(max(0, heads.get(p, 0) - read[p]) for p in producers)


def _rate(db: Store, name: str, now: int) -> float | None:
    """Records processed per second over the recent window, from the driver's samples (None when
    fewer than two: the pipeline is not running, or has just started)."""
    samples = [s for s in db.samples(now - RECENT_MS, name) if s.at <= now]
    if len(samples) < 2 or samples[-1].at == samples[0].at:
        return None
    return (samples[-1].records - samples[0].records) * 1000 / (samples[-1].at - samples[0].at)


def _commit_intervals(db: Store, producers: list[str], now: int) -> dict[str, Any]:
    """The time between successive journaled commits of each producer over the recent window: the
    journal's view of commit latency (a busy stage commits as soon as the previous commit is done)."""
    commits = db.commit_times(producers, now - RECENT_MS).values()
    gaps = [b - a for times in commits for a, b in zip(times, times[1:])]
    return {"commits": sum(len(t) for t in commits),
            "mean": sum(gaps) / len(gaps) if gaps else None, "max": max(gaps) if gaps else None}


def _owners(db: Store, name: str, now: int, workers: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"shard": r.shard, "owner": r.owner, "live": r.owner is not None and r.lease_until >= now,
             "lease_until": r.lease_until, "sequencer": r.sequencer, "version": r.version,
             "input_watermark": r.input_watermark, "output_watermark": r.output_watermark,
             "worker": workers.get(r.owner) if r.owner else None} for r in db.shard_rows(name)]


def _workers(db: Store) -> dict[str, dict[str, Any]]:
    """Continuous mode's worker tasks by owner name, from their ``worker`` meta rows."""
    out = {}
    for key, value in db.metas(meta.WORKER).items():
        _, run, owner = meta.parse_worker(key)
        out[owner] = {"run": run, **json.loads(value)}
    return out
