"""Monoid computations (docs/architecture.md §3.13): records folded into partial aggregates where
they are read, and partials merged into the store as delta rows, without reading a key's old value.

``Folder`` folds the records of one read (a micro-batch read task, a continuous worker's pass over
an interval's new records) per key and window. ``process_monoid_shard`` is a monoid computation's
``process_shard``: it folds the partials and the records that travelled alone, then, per key,
sets a watermark timer per window, emits every window that is due (its stored delta rows, loaded
for it, combined with the batch's part) and writes the batch's part of the others as new delta
rows. Every ``COMPACT_EVERY``-th batch of a shard also folds each window's delta rows into one.
"""

from __future__ import annotations

import operator
from functools import partial
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from ..errors import UserCodeError
from ..model import END_OF_TIME, ComputationOptions, KeyExtractor, MonoidComputation, Record, Timer
from ..monoids import Add, Constant, Field, Tumbling
from .batch import CheckedRecord, InputRecord, Partial, ShardBatch, ShardCommit, ShardSnapshot
from ..names import id_prefix
from .ports import SegmentColumns
from .failures import dead_letter_value, user_error
from .dedup import IdCheck, drop_duplicates, forget_before
from .context import KeyContext, ValueCheck, add_user_counters, new_counters
from .shard import invoke_on_timer, next_due
from .watermark import output_low_watermark

__all__ = ["Folder", "ColumnarFold", "columnar_fold", "columnar_parts", "columnar_totals", "fold_streams", "process_monoid_shard", "window_tag", "tag_window", "COMPACT_EVERY"]

TAG = "monoid:"
COMPACT_EVERY = 32  # a shard's every 32nd batch folds each window's delta rows into one


def window_tag(window: int) -> str:
    """The tag of the watermark timer that emits a window."""
    return f"{TAG}{window}"


def tag_window(tag: str) -> int | None:
    return int(tag[len(TAG):]) if tag.startswith(TAG) else None


def fold_streams(inputs: Iterable[str], dedup_streams: frozenset[str]) -> frozenset[str]:
    """The input streams a monoid computation folds where it reads them: all but those whose record
    ids are checked, since a partial no longer knows its records' ids (they are folded in the shard)."""
    return frozenset(inputs) - dedup_streams


class Folder:
    """Folds records into one partial aggregate per (key, window), in the order they come."""

    def __init__(self, monoid: MonoidComputation, name: str, watermark_before: int):
        self.monoid, self.name, self.before = monoid, name, watermark_before
        self._zero, self._lift, self._combine = monoid.zero, monoid.lift, monoid.combine
        # one call less per record when the computation keeps the default window (one per key)
        self._window = None if type(monoid).window is MonoidComputation.window else monoid.window
        self.slots: dict[tuple[str, int], list[Any]] = {}  # (key, window) -> [aggregate, records]
        self.columnar = columnar_fold(monoid)

    def add_columns(self, keys: Sequence[str], parts: Sequence[Any], timestamps: Sequence[int],
                    rows: Sequence[int]) -> list[int]:
        """``add_many`` for a ``columnar`` monoid, its records' parts already a column (``parts``, an
        ``int`` each; unread for ``constant``): what ``add_many`` folds, with no call per record.
        Returns the late rows, which travel alone."""
        plan = self.columnar
        assert plan is not None, "add_columns is for a monoid with columnar hooks"
        before = self.before
        alone = [i for i in rows if timestamps[i] < before]
        if alone:
            late = set(alone)
            rows = [i for i in rows if i not in late]
        size = plan.window
        if size is None:
            slot_keys: Iterable[tuple[str, int]] = ((keys[i], END_OF_TIME) for i in rows)
        else:
            slot_keys = ((keys[i], timestamps[i] - timestamps[i] % size + size) for i in rows)
        if plan.field is None:  # a constant part: k records add up to k times it
            totals: dict[tuple[str, int], list[int]] = {slot: [0, n] for slot, n in Counter(slot_keys).items()}
        else:
            totals = {}
            get = totals.get
            for slot, part in zip(slot_keys, (parts[i] for i in rows)):
                total = get(slot)
                if total is None:
                    totals[slot] = [part, 1]
                else:
                    total[0] += part
                    total[1] += 1
        self.add_totals(totals)
        return alone

    def add_totals(self, totals: Mapping[tuple[str, int], Sequence[int]]) -> None:
        """Fold a columnar monoid's records summed per (key, window) (``[part total, records]``,
        as ``SegmentColumns.field_totals`` gives them; a constant part is counted, its total unread)."""
        plan = self.columnar
        assert plan is not None, "add_totals is for a monoid with columnar hooks"
        slots, zero, constant = self.slots, plan.zero, plan.field is None
        for slot, (total, n) in totals.items():
            if constant:
                total = n * plan.constant
            had = slots.get(slot)
            if had is None:
                slots[slot] = [self.combine(slot[0], zero, total), n]
            else:
                had[0] = self.combine(slot[0], had[0], total)
                had[1] += n

    def add_many(self, keys: Sequence[str], values: Sequence[Any], timestamps: Sequence[int], ids: Sequence[str],
                 rows: Iterable[int], schema: ValueCheck | None = None) -> list[int]:
        """Fold in the records at ``rows`` of these columns; returns the rows that must travel alone
        to their shard: late there (the shard counts or delivers them), or whose value does not fit
        its typed stream's ``schema``, or whose ``window`` or ``lift``
        raised or gave no integer window (the shard raises each as a user error, or dead-letters
        the record). One loop over columns: this is a monoid's per-record cost."""
        misfits: set[int] = set()
        if schema is not None:
            rows = list(rows)
            misfits = {rows[j] for j in schema.misfits([values[i] for i in rows])}
        alone: list[int] = []
        slots, before, window, lift, combine, zero = (self.slots, self.before, self._window, self._lift,
                                                      self._combine, self._zero)
        for i in rows:
            timestamp = timestamps[i]
            if timestamp < before or i in misfits:
                alone.append(i)
                continue
            key = keys[i]
            record = Record(key, values[i], timestamp, ids[i])
            try:
                at = END_OF_TIME if window is None else window(record)
                part = lift(record)
            except Exception:
                alone.append(i)
                continue
            if type(at) is not int:
                alone.append(i)
                continue
            slot = slots.get((key, at))
            try:
                if slot is None:
                    slots[(key, at)] = [combine(zero(), part), 1]
                else:
                    slot[0] = combine(slot[0], part)
                    slot[1] += 1
            except Exception as exc:
                raise self._combine_failed(key, exc) from exc
        return alone

    def combine(self, key: str, a: Any, b: Any) -> Any:
        try:
            return self._combine(a, b)
        except Exception as exc:
            raise self._combine_failed(key, exc) from exc

    def _combine_failed(self, key: str, exc: Exception) -> UserCodeError:
        # a half-done combine may have changed the aggregate: never dead-lettered
        return UserCodeError(f"Monoid computation {self.name!r} failed in combine on key {key!r}",
                             got_text=f"{type(exc).__name__}: {exc}",
                             hint="combine(a, b) must accept any two aggregates; fix it and run again: "
                                  "the batch was not committed")

    def partials(self) -> list[Partial]:
        return [Partial(key, window, aggregate, n) for (key, window), (aggregate, n) in self.slots.items()]


class ColumnarFold(NamedTuple):
    """How a monoid folds whole columns: its part is field ``field`` of each value (an ``int``), or
    ``constant`` for every record (0 for a field); its windows are ``tumbling(window)``, or one per
    key (None)."""

    field: str | None
    constant: int
    window: int | None
    zero: int  # the monoid's zero(), an int (ints are immutable: one serves every slot)


def columnar_fold(monoid: MonoidComputation) -> ColumnarFold | None:
    """The monoid's ``ColumnarFold`` when its hooks are ``headrace.monoids``', ``combine`` is
    ``add`` or ``operator.add`` and ``zero()`` an ``int``; None when it folds one record at a time."""
    if monoid.combine is not operator.add and type(monoid.combine) is not Add:
        return None
    try:
        zero = monoid.zero()
    except Exception:
        return None  # the per-record path reports it
    if type(zero) is not int:  # adding a column's ints first, then to zero, is exact for ints only
        return None
    lift, window = monoid.lift, monoid.window
    if type(monoid).window is MonoidComputation.window:
        size = None
    elif type(window) is Tumbling:
        size = window.size
    else:
        return None
    if type(lift) is Field:
        return ColumnarFold(lift.name, 0, size, zero)
    if type(lift) is Constant and type(lift.value) is int:
        return ColumnarFold(None, lift.value, size, zero)
    return None


def _columnar(folder: Folder, extractor: KeyExtractor, seg: SegmentColumns,
              schema: ValueCheck | None) -> ColumnarFold | None:
    """The folder's ``ColumnarFold`` when ``seg`` may be folded from its field columns: the
    monoid's hooks are ``columnar``, the extractor a ``key_by("field")`` of a str field, and the
    segment kept field columns under the schema the reader checks."""
    plan = folder.columnar
    if plan is None or extractor.field is None or extractor.kind is not str or seg.fields_schema is None:
        return None
    if schema is not None and schema.fingerprint != seg.fields_schema:
        return None
    return plan


def columnar_parts(folder: Folder, extractor: KeyExtractor, seg: SegmentColumns,
                   schema: ValueCheck | None) -> tuple[list[str], list[Any]] | None:
    """The keys and parts (for ``Folder.add_columns``) of a typed stream's segment, read from its
    field columns; None when it is folded one record at a time instead, with the same result: not
    ``_columnar``, or a key is no ``str`` or a part no ``int`` (which the per-record path fails or
    dead-letters)."""
    plan = _columnar(folder, extractor, seg, schema)
    if plan is None:
        return None
    keys = seg.field(extractor.field, str)  # type: ignore[arg-type]
    parts = keys if plan.field is None else seg.field(plan.field, int)
    return None if keys is None or parts is None else (keys, parts)


def columnar_totals(folder: Folder, extractor: KeyExtractor, seg: SegmentColumns, schema: ValueCheck | None,
                    since: int) -> dict[tuple[str, int], tuple[int, int]] | None:
    """A typed stream's segment summed per (key, window) by the store's columns
    (``SegmentColumns.field_totals``), for ``Folder.add_totals``, when every record is at or after
    ``since`` (none is late for any folder); None when ``columnar_parts`` must fold it instead."""
    plan = _columnar(folder, extractor, seg, schema)
    if plan is None:
        return None
    return seg.field_totals(extractor.field, plan.field, plan.window, since)  # type: ignore[arg-type]


def process_monoid_shard(
    computation: MonoidComputation,
    name: str,
    options: ComputationOptions,
    outputs: frozenset[str] | None,
    batch: ShardBatch,
    snapshot: ShardSnapshot,
    stored: dict[tuple[str, int], list[bytes]],
    check_ids: IdCheck | None = None,
    schemas: Mapping[str, ValueCheck] | None = None,
) -> ShardCommit:
    """One shard batch of a monoid computation, uncommitted. ``stored`` holds the delta rows of
    every due window (and, in a compacting batch, of every window of the shard); ``schemas`` as
    for ``process_shard``: a lone record that does not fit fails, and so does an emitted value."""
    counters = new_counters()
    checks = schemas or {}
    records, seen = drop_duplicates(batch, options, check_ids, counters)
    w_before, w_after = batch.watermark_before, batch.watermark_after
    ctx = KeyContext(name, options, outputs, id_prefix(name, batch.batch, batch.shard), snapshot.output_watermark,
                     schemas)
    dead_letters = options.on_error == "dead_letter"
    for bad in batch.rejected:
        ctx.bind(bad.key, None, {})
        ctx.dead_letter(bad.value, bad.timestamp)
        counters["dead_lettered"] = counters.get("dead_lettered", 0) + 1

    folder = Folder(computation, name, w_before)
    for p in batch.partials:
        slot = folder.slots.get((p.key, p.window))
        if slot is None:
            folder.slots[(p.key, p.window)] = [p.aggregate, p.records]
        else:
            slot[0] = folder.combine(p.key, slot[0], p.aggregate)
            slot[1] += p.records
        counters["records"] += p.records
    for r in records:  # those that travelled alone: late, other streams, or refused by a Folder
        if r.timestamp < w_before:
            if options.late != "deliver":
                counters["late_dropped"] += 1
                continue
            counters["late_delivered"] += 1
        counters["records"] += 1
        record = Record(r.key, r.value, r.timestamp, r.id)  # as the Folder makes them: a monoid folds its inputs alike
        try:
            if r.stream in checks and type(r) is not CheckedRecord:
                checks[r.stream].require(r.stream, r.value)
            window = computation.window(record)
            if type(window) is not int:
                raise TypeError(f"window(record) returned {window!r} of type {type(window).__name__}, "
                                "not integer milliseconds")
            part = computation.lift(record)
        except Exception as exc:
            what = f"record {r.id!r} (timestamp {r.timestamp})"
            if not dead_letters:
                raise user_error(name, r.key, what, exc) from exc
            ctx.bind(r.key, None, {})
            ctx.dead_letter(dead_letter_value(name, r.key, what, exc, r.stream, r.value, r.id), r.timestamp)
            counters["dead_lettered"] = counters.get("dead_lettered", 0) + 1
            continue
        slot = folder.slots.get((r.key, window))
        if slot is None:
            folder.slots[(r.key, window)] = [folder.combine(r.key, computation.zero(), part), 1]
        else:
            slot[0] = folder.combine(r.key, slot[0], part)
            slot[1] += 1

    by_key: dict[str, dict[int, Any]] = {}
    for (key, window), (aggregate, _) in folder.slots.items():
        by_key.setdefault(key, {})[window] = aggregate
    timers_by_key: dict[str, dict[str, Any]] = {}
    for t in snapshot.due_timers:
        timers_by_key.setdefault(t.key, {})[t.tag] = t
    for key in timers_by_key:
        by_key.setdefault(key, {})
    stored_by_key: dict[str, dict[int, list[bytes]]] = {}
    for (key, window), rows in stored.items():
        stored_by_key.setdefault(key, {})[window] = rows
        by_key.setdefault(key, {})

    decode, encode = options.codec.decode, ctx._encode
    writes: list[tuple[str, int, bytes]] = []
    deletes: list[tuple[str, int]] = []
    for key, windows in by_key.items():
        timers = timers_by_key.get(key, {})
        ctx.bind(key, None, timers)
        ctx.low_watermark = w_after
        for window in windows:
            ctx.set_timer(window_tag(window), window)
        held = stored_by_key.get(key, {})
        while timers:
            timer = next_due(timers, w_after, batch.wall_clock)
            if timer is None:
                break
            ctx.fired(timer)
            counters["timers_fired"] += 1
            due = tag_window(timer.tag)
            if due is None:
                continue  # not a window's timer (a monoid computation sets no others)
            aggregate = computation.zero()
            for raw in held.pop(due, []):
                aggregate = folder.combine(key, aggregate, decode(raw))
            if due in windows:
                aggregate = folder.combine(key, aggregate, windows.pop(due))
            deletes.append((key, due))
            ctx._timestamp = timer.timestamp
            invoke_on_timer(ctx, name, timer, partial(computation.emit, ctx, Timer(timer.tag, timer.timestamp,
                                                                                   timer.domain), aggregate),
                            f"emit of window {due}", counters, dead_letters)
        for window, rows in held.items():  # a compacting batch: each window's rows become one
            if len(rows) + (window in windows) > 1:
                aggregate = windows.pop(window, None)
                aggregate = computation.zero() if aggregate is None else aggregate
                for raw in rows:
                    aggregate = folder.combine(key, aggregate, decode(raw))
                deletes.append((key, window))
                writes.append((key, window, encode(aggregate)))
        for window, aggregate in windows.items():
            writes.append((key, window, encode(aggregate)))
        if ctx.finish_key() is not None:
            raise UserCodeError(f"Monoid computation {name!r} set ctx.state for key {key!r}",
                                got_text="a ctx.state assignment in emit",
                                hint="a monoid computation's state is its aggregate: emit what it needs with "
                                     "ctx.produce, or subclass Computation to keep state of your own")

    counters["late_productions"] = ctx.late_productions
    add_user_counters(counters, ctx)
    return ShardCommit(
        computation=batch.computation, shard=batch.shard, batch=batch.batch, base_version=snapshot.version,
        sequencer=batch.sequencer, timer_sets=ctx.timer_sets, timer_deletes=ctx.timer_deletes,
        seen_ids=seen.exact, seen_ranges=seen.ranges, forget_ids_before=forget_before(w_after, options), productions=ctx._productions,
        input_watermark=w_after, output_watermark=output_low_watermark(snapshot.output_watermark, w_after),
        counters={k: v for k, v in counters.items() if v}, strong_productions=options.output_semantics != "at_least_once",
        exactly_once=options.conditional_commits, productions_after_state=options.output_semantics == "at_most_once",
        positions=batch.positions, journal_as=batch.journal_as,
        partial_writes=writes, partial_deletes=deletes)
