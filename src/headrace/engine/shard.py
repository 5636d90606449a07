"""Processing one key shard for one batch, the heart of the engine: per key, in arrival order, its
records (late ones judged against the watermark the batch started under), then every due timer in
timestamp order, including those set in this batch. State is loaded once per key and written once
if it changed. The whole outcome becomes one ``ShardCommit``."""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Callable, Mapping

from ..model import Computation, ComputationOptions, Record, Timer
from .batch import CheckedRecord, DueTimer, InputRecord, ShardBatch, ShardCommit, ShardSnapshot
from ..names import STATE_TTL_TIMER, id_prefix
from .dedup import IdCheck, drop_duplicates, forget_before
from .failures import dead_letter_value, invoke_on_timer, user_error
from .watchdog import guarded
from .watermark import output_low_watermark
from .context import KeyContext, ValueCheck, add_user_counters, new_counters

__all__ = ["KeyContext", "process_shard", "ValueCheck", "invoke_on_timer", "drop_duplicates", "forget_before"]


def _misfits(records: list[InputRecord], checks: Mapping[str, ValueCheck]) -> set[tuple[str, str]] | None:
    """(stream, id) of the records whose value does not fit their typed stream: one check of each
    stream's column of values, rather than one per value. None if that check raised: each record
    is then checked on its own, where its error is its own (failed or dead-lettered)."""
    if not checks:
        return set()
    by_stream: dict[str, list[InputRecord]] = {}
    for r in records:
        if r.stream in checks and type(r) is not CheckedRecord:
            by_stream.setdefault(r.stream, []).append(r)
    try:
        return {(stream, rs[i].id) for stream, rs in by_stream.items()
                for i in checks[stream].misfits([r.value for r in rs])}
    except Exception:
        return None


def _group_by_key(records: list[InputRecord]) -> dict[str, list[InputRecord]]:
    groups: defaultdict[str, list[InputRecord]] = defaultdict(list)
    for r in records:
        groups[r.key].append(r)
    return groups


def _admits_late(deliver_late: bool, counters: dict[str, int]) -> bool:
    """A late record (before the watermark the batch started under): counted, and delivered only
    with ``late="deliver"``."""
    counters["late_delivered" if deliver_late else "late_dropped"] += 1
    return deliver_late


def _deliver(ctx: KeyContext, process_record: Callable[..., None], name: str, key: str, group: list[InputRecord],
             w_before: int, deliver_late: bool, counters: dict[str, int]) -> int:
    """A key's records, in order, when none needs a TTL check, a savepoint or a value check (the
    common case, per record the engine's hottest loop): how many were delivered; a late one is
    dropped or delivered as ``late`` says."""
    delivered = 0
    make = tuple.__new__  # a Record without NamedTuple's Python-level __new__
    try:
        for stream, _, value, ts, rid in group:
            if ts < w_before and not _admits_late(deliver_late, counters):
                continue
            delivered += 1
            ctx._timestamp = ts
            process_record(ctx, make(Record, (key, value, ts, rid, stream)))
    except Exception as exc:
        raise user_error(name, key, f"record {rid!r} (timestamp {ts})", exc) from exc
    return delivered


def next_due(timers: dict[str, DueTimer], watermark: int, wall_clock: int) -> DueTimer | None:
    best: DueTimer | None = None
    for t in timers.values():
        due = t.timestamp <= (watermark if t.domain == "watermark" else wall_clock)
        if due and (best is None or (t.timestamp, t.domain) < (best.timestamp, best.domain)):
            best = t
    return best


def process_shard(
    computation: Computation,
    name: str,
    options: ComputationOptions,
    outputs: frozenset[str] | None,
    batch: ShardBatch,
    snapshot: ShardSnapshot,
    check_ids: IdCheck | None = None,
    schemas: Mapping[str, ValueCheck] | None = None,
) -> ShardCommit:
    """Run user code for one shard batch and return everything it changed, uncommitted.

    ``schemas``: the typed streams whose values the batch checks: productions to them, and input
    records of them (a misfit is a failure of the record, under the ``on_error`` policy)."""
    counters = new_counters()
    checks = schemas or {}
    records, seen = drop_duplicates(batch, options, check_ids, counters)
    misfits = _misfits(records, checks)
    by_key = _group_by_key(records)
    timers_by_key: dict[str, dict[str, DueTimer]] = {}
    for t in snapshot.due_timers:
        timers_by_key.setdefault(t.key, {})[t.tag] = t
    for key in timers_by_key:
        by_key.setdefault(key, [])

    ctx = KeyContext(name, options, outputs, id_prefix(name, batch.batch, batch.shard), snapshot.output_watermark,
                     schemas)
    process_record = guarded(computation.process_record, options.process_timeout_s, "process_record")
    process_timer = guarded(computation.process_timer, options.process_timeout_s, "process_timer")
    w_before, w_after, wall = batch.watermark_before, batch.watermark_after, batch.wall_clock
    deliver_late = options.late == "deliver"
    dead_letters = options.on_error == "dead_letter"
    for bad in batch.rejected:
        ctx.bind(bad.key, None, {})
        ctx.dead_letter(bad.value, bad.timestamp)
        counters["dead_lettered"] = counters.get("dead_lettered", 0) + 1
    state_writes: list[tuple[str, bytes | None]] = []
    ctx.wall_clock = wall
    ttl = options.state_ttl_ms is not None
    # what most batches need no part of (a TTL, dead letters, values to check) is decided once:
    # without them a key's records take the plain loop (_deliver)
    guarded_each = ttl or dead_letters or misfits is None or bool(misfits)
    states = snapshot.states
    delivered = 0
    for key, group in by_key.items():
        timers = timers_by_key.get(key, {})
        ctx.bind(key, states.get(key), timers)
        ctx.low_watermark = w_before
        if not guarded_each:
            delivered += _deliver(ctx, process_record, name, key, group, w_before, deliver_late, counters)
        else:
            for r in group:
                ts = r.timestamp
                if ttl and ctx.expire_before(ts):  # expired before this record: it sees no state
                    counters["state_expired"] = counters.get("state_expired", 0) + 1
                if ts < w_before and not _admits_late(deliver_late, counters):
                    continue
                delivered += 1
                ctx._timestamp = ts
                point = ctx.savepoint() if dead_letters else None
                try:
                    if (misfits is None and r.stream in checks and type(r) is not CheckedRecord
                            or misfits and (r.stream, r.id) in misfits):
                        checks[r.stream].require(r.stream, r.value)
                    uses = ctx._uses
                    process_record(ctx, Record(key, r.value, ts, r.id, r.stream))
                    ctx.renew(uses)
                    if point is not None:
                        ctx.settle()
                except Exception as exc:
                    what = f"record {r.id!r} (timestamp {r.timestamp})"
                    if point is None:
                        raise user_error(name, key, what, exc) from exc
                    ctx.rollback(point)
                    ctx.dead_letter(dead_letter_value(name, key, what, exc, r.stream, r.value, r.id), r.timestamp)
                    counters["dead_lettered"] = counters.get("dead_lettered", 0) + 1
        ctx.low_watermark = w_after
        while timers:
            timer = next_due(timers, w_after, wall)
            if timer is None:
                break
            if timer.tag == STATE_TTL_TIMER:
                ctx.expire(timer)
                counters["state_expired"] = counters.get("state_expired", 0) + 1
                continue
            ctx.fired(timer)
            counters["timers_fired"] += 1
            ctx._timestamp = timer.timestamp
            uses = ctx._uses
            invoke_on_timer(ctx, name, timer, partial(process_timer, ctx, Timer(timer.tag, timer.timestamp, timer.domain)),
                            f"{timer.domain} timer {timer.tag!r} at {timer.timestamp}", counters, dead_letters)
            ctx.renew(uses)
        write = ctx.finish_key()
        if write is not None:
            state_writes.append(write)

    counters["records"] += delivered
    counters["late_productions"] = ctx.late_productions
    add_user_counters(counters, ctx)
    return ShardCommit(
        computation=batch.computation,
        shard=batch.shard,
        batch=batch.batch,
        base_version=snapshot.version,
        sequencer=batch.sequencer,
        state_writes=state_writes,
        timer_sets=ctx.timer_sets,
        timer_deletes=ctx.timer_deletes,
        seen_ids=seen.exact,
        seen_ranges=seen.ranges,
        forget_ids_before=forget_before(w_after, options),
        productions=ctx._productions,
        input_watermark=w_after,
        output_watermark=output_low_watermark(snapshot.output_watermark, w_after),
        counters={k: v for k, v in counters.items() if v},
        strong_productions=options.output_semantics != "at_least_once",
        exactly_once=options.conditional_commits,
        productions_after_state=options.output_semantics == "at_most_once",
        positions=batch.positions,
        journal_as=batch.journal_as,
    )
