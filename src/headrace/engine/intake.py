"""One read side for every runtime (docs/architecture.md §3.7): from a range of each producer's
batches to a consumer's per-interval input. The continuous worker, the micro-batch source's tasks
and the harness all read through here (``gather``), so they agree by construction on keys, bad
input, dead letters and watermarks.

    ranges ─► routed segments of the consumer's intervals (already keyed by their producer),
              or, for batches not routed for it, the stream's segments keyed here
           ─► fences (records an earlier layout already took) ─► a monoid's fold
           ─► per interval: the rows to deliver, and the rejected ones (no key: interval 0)
           ─► records (values decoded once; an undecodable one is rejected too)

A rejected record fails the batch with a ``BadInputError`` that names it, or, with
``on_error="dead_letter"``, becomes a dead letter ``{computation, key, at, stream, record_id,
value, error}``: ``value`` is the decoded value, or its stored bytes when it cannot be decoded.
"""

from __future__ import annotations

import pickle
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Collection, Container, Iterable, Iterator, Mapping, NamedTuple, Sequence

from ..errors import MISSING_MODULE_HINT, BadInputError
from ..model import KeyExtractor
from .batch import CheckedRecord, InputRecord, rows_by_shard, shard_of, shards_of
from .consumer import Consumer, Range
from .monoid import Folder, columnar_parts, columnar_totals
from .ports import Fence, IntervalStore, RouteRequest, SegmentColumns
from .routing import keys_of
from .shard import ValueCheck

__all__ = ["Keyed", "Selected", "route_requests", "reader_dests", "read_keyed", "select", "records_of", "gather",
           "reject_rows", "rejection", "is_checked"]

DECODING = "decoding it"


class Keyed(NamedTuple):
    """One segment of a stream with the consumer's key of each record (None: rejected, ``errors``
    says why) and each record's interval; ``dest``: the interval a routed segment went to (every
    interval's has the records with no key), None for a stream's own segment."""

    stream: str
    producer: str
    batch: int
    seg: SegmentColumns
    keys: list[str | None]
    errors: list[str | None] | None
    shards: list[int | None]
    dest: int | None = None


def route_requests(consumer: Consumer, ranges: Sequence[Range], dests: Sequence[int] | None) -> list[RouteRequest]:
    """The ``read_routes`` calls ``read_keyed`` makes for ``ranges``: the segments routed under
    the consumer's own layout, of ``dests``, and those routed under another, of every interval."""
    return [request for request, _ in _route_requests(consumer, ranges, dests)]


def _route_requests(consumer: Consumer, ranges: Sequence[Range],
                    dests: Sequence[int] | None) -> list[tuple[RouteRequest, bool]]:
    """``route_requests``, each with whether it reads segments routed under the consumer's own layout."""
    n = consumer.shards
    same = [(r.producer, r.after, r.upto) for r in ranges if r.layout == n]
    other = [(r.producer, r.after, r.upto) for r in ranges if r.layout is not None and r.layout != n]
    return [(RouteRequest(consumer.name, wanted, d), own)
            for wanted, d, own in ((same, dests, True), (other, None, False)) if wanted]


def reader_dests(consumer: Consumer, shards: Collection[int] | None) -> list[int] | None:
    """The intervals a reader of ``shards`` (every interval: None) reads the routed segments of."""
    return None if shards is None or len(shards) >= consumer.shards else sorted(shards)


COLUMNAR = 512
"""Records: a segment at least this long has its keys hashed to intervals in columns
(``SegmentColumns.key_shards``; numpy's fixed cost per call is tens of microseconds), a shorter
one a key at a time through the reader's cache of known keys."""


def read_keyed(store: IntervalStore, consumer: Consumer, ranges: Sequence[Range], dests: Sequence[int] | None,
               shard_ids: dict[str, int]) -> Iterator[Keyed]:
    """The consumer's records in ``ranges``: its routed segments of ``dests`` (every interval: None)
    where routed under its own layout, every interval's where routed under another (re-keyed to
    its own), and the streams' own segments keyed here where not routed."""
    n = consumer.shards
    for request, own in _route_requests(consumer, ranges, dests):
        for routed in store.read_routes(*request):
            if routed.stream not in consumer.inputs:
                continue
            keys = routed.seg.keys
            if own:  # its producer put each record with a key in its interval under this very layout
                shards: list[int | None] = [routed.dest] * len(keys)
                if None in keys:
                    shards = [None if key is None else routed.dest for key in keys]
            elif len(keys) >= COLUMNAR:
                shards = routed.seg.key_shards(n)
            else:
                shards = shards_of(keys, n, shard_ids)
            yield Keyed(routed.stream, routed.producer, routed.batch, routed.seg, keys, routed.seg.errors,
                        shards, routed.dest)
    for r in ranges:
        if r.layout is not None:
            continue
        for stream in consumer.streams_of(r.producer):
            store.check_replay(stream, r.producer, r.after)  # not routed for it: the stream's own, all kept?
            extractor = consumer.inputs[stream]
            for batch, seg in _segments(store, consumer.name, stream, r.producer, r.after, r.upto):
                keys, errors = _key_segment(extractor, seg)
                columned = (seg.field_shards(extractor.field, extractor.kind, n)
                            if extractor.field is not None and len(keys) >= COLUMNAR else None)
                yield Keyed(stream, r.producer, batch, seg, keys, errors,
                            columned if columned is not None else shards_of(keys, n, shard_ids))


def _key_segment(extractor: KeyExtractor, seg: SegmentColumns) -> tuple[list[str | None], list[str | None] | None]:
    """A stream segment's keys, extracted here (a field's from the field columns, no value
    unpickled, when the segment has them); a record whose value cannot be decoded has none."""
    if extractor.field is not None and seg.fields_schema is not None:
        columned = seg.key_field(extractor.field, extractor.kind)
        if columned is not None:
            return list(columned), None
    try:
        return keys_of(extractor, seg.values)
    except Exception:
        pass
    values, undecodable = _values_at(seg, range(len(seg.timestamps)))
    decodable = [i for i in range(len(seg.timestamps)) if i not in undecodable]
    some, why = keys_of(extractor, [values[i] for i in decodable])
    keys: list[str | None] = [None] * len(seg.timestamps)
    errors: list[str | None] = [undecodable.get(i) for i in range(len(keys))]
    for j, i in enumerate(decodable):
        keys[i] = some[j]
        if why is not None:
            errors[i] = why[j]
    return keys, errors


class Selected(NamedTuple):
    """What a reader keeps of a keyed segment: per interval its rows to deliver (in order), and the
    rows that go to interval 0 as rejected input."""

    keyed: Keyed
    rows: dict[int, list[int]]
    rejected: list[int]


def select(consumer: Consumer, items: Iterable[Keyed], shards: Container[int] | None,
           fences: tuple[Fence, ...] = (), folder_of: Callable[[int], Folder | None] = lambda shard: None,
           before: int | None = None) -> Iterator[Selected]:
    """Each keyed segment's rows of ``shards`` (every interval: None), less those an earlier layout
    already took (``fences``); a monoid's foldable records go into ``folder_of(shard)``, folded
    from the field columns when it can (``before``: the latest watermark of any of its folders, so
    that a segment with no record behind it has no late record for any), and the rest travel alone."""
    for k in items:
        folding = k.stream in consumer.fold_streams and not fences
        if folding and before is not None:
            left = _fold_fields(consumer, k, shards, folder_of, before)
            if left is not None:
                yield Selected(k, left, [])
                continue
        rows = rows_by_shard(k.shards, shards)
        rejected: list[int] = []
        if None in k.keys:
            missing = [i for i, key in enumerate(k.keys)
                       if key is None and not (fences and _taken_by_zero(fences, k.producer, k.batch))]
            if missing and consumer.options.on_error != "dead_letter":
                _refuse(consumer, k, missing[0])  # every reader stops at it, not only interval 0
            if (shards is None or 0 in shards) and k.dest in (None, 0):
                rejected = missing
        schema = consumer.schemas.get(k.stream)
        for shard in list(rows):
            mine = rows[shard]
            if fences:
                mine = [i for i in mine if not _taken(fences, k.keys[i], k.producer, k.batch)]  # type: ignore[arg-type]
            folder = folder_of(shard) if folding else None
            if mine and folder is not None:
                values = _all_values(k.seg)  # an undecodable value leaves the segment unfolded: it is rejected
                if values is not None:
                    mine = folder.add_many(k.keys, values, k.seg.timestamps, k.seg.ids, mine,  # type: ignore[arg-type]
                                           None if is_checked(k.seg, schema) else schema)
            if mine:
                rows[shard] = mine
            else:
                del rows[shard]
        if rows or rejected:
            yield Selected(k, rows, rejected)


def _refuse(consumer: Consumer, k: Keyed, row: int) -> None:
    """Raise the ``BadInputError`` of a record with no key (``on_error="fail"``)."""
    reject_rows(consumer, [k.stream], [k.seg.raw_values[row]], [k.seg.timestamps[row]], [k.seg.ids[row]],
                [(k.errors or [None] * len(k.keys))[row]])


def _fold_fields(consumer: Consumer, k: Keyed, shards: Container[int] | None,
                 folder_of: Callable[[int], Folder | None], before: int) -> dict[int, list[int]] | None:
    """A typed stream's segment folded from its field columns (summed in Arrow, ``columnar_totals``,
    or ``columnar_parts``' lists when some record may be late): the rows that travel alone (late
    ones) by interval, or None: it takes the per-record path."""
    if None in k.keys:
        return None
    # a folder of an interval this reader holds (a segment not routed for it holds every interval's records)
    held = sorted({s for s in k.shards if s is not None and (shards is None or s in shards)})
    first = next((f for f in map(folder_of, held) if f is not None), None)
    if first is None:
        return None
    extractor, schema = consumer.inputs[k.stream], consumer.schemas.get(k.stream)
    totals = columnar_totals(first, extractor, k.seg, schema, before)
    if totals is not None:
        mine: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
        for slot, summed in totals.items():
            shard = shard_of(slot[0], consumer.shards)
            if shards is None or shard in shards:
                mine.setdefault(shard, {})[slot] = summed
        for shard, owned in mine.items():
            folder_of(shard).add_totals(owned)  # type: ignore[union-attr]
        return {}
    columns = columnar_parts(first, extractor, k.seg, schema)
    if columns is None:
        return None
    keys, parts = columns
    out: dict[int, list[int]] = {}
    for shard, rows in rows_by_shard(k.shards, shards).items():
        late = folder_of(shard).add_columns(keys, parts, k.seg.timestamps, rows)  # type: ignore[union-attr]
        if late:
            out[shard] = late
    return out


def _all_values(seg: SegmentColumns) -> list[Any] | None:
    try:
        return seg.values
    except Exception:
        return None


def is_checked(seg: SegmentColumns, schema: ValueCheck | None) -> bool:
    """Whether the segment's writer already checked its values against ``schema`` (its field columns
    were written under it)."""
    return schema is not None and seg.fields_schema == schema.fingerprint


def records_of(consumer: Consumer, picked: Selected) -> tuple[dict[int, list[InputRecord]], dict[int, list[InputRecord]]]:
    """The selected rows as records (values decoded once), and the ones rejected as dead letters
    (or, under ``on_error="fail"``, the ``BadInputError``), by interval: a record with no key is
    interval 0's to reject, one whose value cannot be decoded its own interval's."""
    k = picked.keyed
    mine = [i for rs in picked.rows.values() for i in rs]
    make = CheckedRecord if is_checked(k.seg, consumer.schemas.get(k.stream)) else InputRecord
    stamps, ids = k.seg.timestamps, k.seg.ids
    values, undecodable = _values_at(k.seg, mine)
    if not picked.rejected and not undecodable:  # the common case: every interval's records in one pass
        return _made(make, k, picked.rows, list(values.values())), {}
    errors = k.errors or [None] * len(k.keys)
    by_shard: dict[int, list[InputRecord]] = {}
    rejected: dict[int, list[InputRecord]] = {}
    for shard in sorted(set(picked.rows) | ({0} if picked.rejected else set())):
        rows = picked.rows.get(shard, [])
        bad = sorted(set(picked.rejected) | {i for i in rows if i in undecodable}) if shard == 0 else \
            [i for i in rows if i in undecodable]
        good = [make(k.stream, k.keys[i], values[i], stamps[i], ids[i]) for i in rows  # type: ignore[arg-type]
                if i not in undecodable]
        if good:
            by_shard.setdefault(shard, []).extend(good)
        if bad:
            raw = k.seg.raw_values
            rejected.setdefault(shard, []).extend(reject_rows(
                consumer, [k.stream] * len(bad), [raw[i] for i in bad], [stamps[i] for i in bad],
                [ids[i] for i in bad], [errors[i] for i in bad]))
    return by_shard, rejected


def _made(make: type[InputRecord], k: Keyed, rows: Mapping[int, list[int]],
          decoded: list[Any]) -> dict[int, list[InputRecord]]:
    """Each interval's records of ``rows`` whose values ``decoded`` holds in the same order, built
    without a Python call per record (NamedTuple's ``__new__`` is one)."""
    keys, stamps, ids = k.keys, k.seg.timestamps, k.seg.ids
    out: dict[int, list[InputRecord]] = {}
    at = 0
    for shard, picked in rows.items():
        get = _picker(picked)
        columns = zip(repeat(k.stream), get(keys), decoded[at:at + len(picked)], get(stamps), get(ids))
        out[shard] = list(map(tuple.__new__, repeat(make), columns))
        at += len(picked)
    return dict(sorted(out.items()))


def _picker(rows: list[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """A C-speed pick of ``rows`` from a column (``itemgetter``), a tuple even of one row or none."""
    if len(rows) > 1:
        return itemgetter(*rows)
    return lambda column: tuple(column[i] for i in rows)


def gather(store: IntervalStore, consumer: Consumer, ranges: Sequence[Range], shards: Collection[int] | None,
           shard_ids: dict[str, int] | None = None, fences: tuple[Fence, ...] = (),
           folder_of: Callable[[int], Folder | None] = lambda shard: None, before: int | None = None,
           ) -> tuple[dict[int, list[InputRecord]], dict[int, list[InputRecord]]]:
    """The whole read side in one call: ``ranges`` read (``read_keyed``), the rows of ``shards``
    (every interval: None) selected (``select``) and made records (``records_of``), by interval:
    the records to deliver and the rejected ones."""
    dests = reader_dests(consumer, shards)
    records: dict[int, list[InputRecord]] = {}
    rejected: dict[int, list[InputRecord]] = {}
    keyed = read_keyed(store, consumer, ranges, dests, {} if shard_ids is None else shard_ids)
    for picked in select(consumer, keyed, shards, fences, folder_of, before):
        taken, refused = records_of(consumer, picked)
        for shard, rs in taken.items():
            records.setdefault(shard, []).extend(rs)
        for shard, rs in refused.items():
            rejected.setdefault(shard, []).extend(rs)
    return records, rejected


def reject_rows(consumer: Consumer, streams: Sequence[str], raws: Sequence[bytes], stamps: Sequence[int],
                ids: Sequence[str], errors: Sequence[str | None]) -> list[InputRecord]:
    """Records with no key (``errors`` says why) or whose value cannot be decoded, as dead letters:
    ``value`` is the decoded value, or the stored bytes when it cannot be decoded."""
    out = []
    for stream, raw, ts, rid, error in zip(streams, raws, stamps, ids, errors):
        try:
            value = pickle.loads(raw)
        except Exception as exc:
            out.append(rejection(consumer, stream, None, DECODING, _cause(exc), raw, ts, rid, exc))
            continue
        out.append(rejection(consumer, stream, None, _keying(consumer, stream), error or "no key", value, ts, rid))
    return out


def rejection(consumer: Consumer, stream: str, key: str | None, stage: str, cause: str, value: Any,
              timestamp: int, record_id: str, exc: BaseException | None = None) -> InputRecord:
    """A record the consumer cannot take: its dead letter (bound for interval 0), or, under
    ``on_error="fail"``, the ``BadInputError`` that names it."""
    if consumer.options.on_error != "dead_letter":
        raise BadInputError(
            f"Computation {consumer.name!r} cannot take record {record_id!r} of stream {stream!r}: failed {stage}",
            got_text=cause,
            hint=MISSING_MODULE_HINT if isinstance(exc, ImportError) or "No module named" in cause else
            "fix the record or the key extractor, or add the computation with on_error='dead_letter' to route "
            "such records aside") from None
    return InputRecord(stream, "", {"computation": consumer.name, "key": key, "at": f"failed {stage}",
                                    "stream": stream, "record_id": record_id, "value": value, "error": cause},
                       timestamp, record_id)


def _keying(consumer: Consumer, stream: str) -> str:
    return f"extracting its key with {consumer.inputs[stream].description}"


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _values_at(seg: SegmentColumns, rows: Sequence[int]) -> tuple[dict[int, Any], dict[int, str]]:
    """The decoded values at ``rows`` (one pass when all decode), and why each undecodable one is not."""
    try:
        return dict(zip(rows, seg.values_at(rows))), {}
    except Exception:
        pass
    values: dict[int, Any] = {}
    failed: dict[int, str] = {}
    raw = seg.raw_values
    for i in rows:
        try:
            values[i] = pickle.loads(raw[i])
        except Exception as exc:
            failed[i] = _cause(exc)
    return values, failed


def _segments(store: IntervalStore, name: str, stream: str, producer: str, after: int, upto: int) -> Iterator[Any]:
    """The segments of ``producer`` on ``stream`` in batches (after, upto]; one that cannot be read
    stops the reader with an error that names it (retrying could never get past it)."""
    try:
        yield from store.read_segment_columns(stream, producer, after, upto)
    except Exception as exc:
        raise _unreadable(name, stream, producer, f"in its batches {after + 1}..{upto}", exc) from None


def _unreadable(name: str, stream: str, producer: str, where: str, exc: Exception) -> BadInputError:
    return BadInputError(
        f"Computation {name!r} cannot decode a record of stream {stream!r} written by {producer!r} {where}",
        got_text=_cause(exc),
        hint=MISSING_MODULE_HINT if isinstance(exc, ImportError) else
        "a value this worker cannot unpickle: install on the workers the modules its classes come from")


def _taken(fences: tuple[Fence, ...], key: str, producer: str, batch: int) -> bool:
    """Whether an interval of an earlier layout already took this record for its key."""
    return any(batch <= at.get(shard_of(key, n), {}).get(producer, 0) for n, at in fences)


def _taken_by_zero(fences: tuple[Fence, ...], producer: str, batch: int) -> bool:
    """Whether an earlier layout's interval 0, which takes bad input, already took this batch's."""
    return any(batch <= at.get(0, {}).get(producer, 0) for _, at in fences)
