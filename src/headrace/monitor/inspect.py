"""Look inside a computation from the store: a key's state and pending timers, and its dead letters."""

from __future__ import annotations

from typing import Any, Iterator

from ..codecs import CODECS, Codec, codec_named, shown_value
from ..errors import OptionError
from ..model import Record, Timer
from ..store import Store, open_store
from .graph import recorded_graphs

__all__ = ["state", "timers", "dead_letters", "stored_records"]


def state(store: str, computation: str, key: str, codec: str | Codec | None = None, *,
          unpickle: bool = False) -> Any:
    """The state ``computation`` holds for ``key``, decoded with its codec (the one its run
    recorded; pass ``codec=`` for a codec of your own, which the store knows only by name).

    A pickled state is decoded only as far as it is plain data (``codecs.safe_loads``: no code
    runs), else shown as ``Pickled(size)``; ``unpickle=True`` unpickles it in full, which runs
    whatever code the bytes name (docs/security.md)."""
    db = open_store(store, read_only=True)
    try:
        spec = _computation(db, computation)
        raw = db.state(computation, key)
        if raw is None:
            _unknown_key(db, computation, key, has_timers=bool(db.timers(computation, key)))
            return None
        chosen = _codec(computation, spec, codec)
        return shown_value(raw, unpickle) if chosen is CODECS["pickle"] else chosen.decode(raw)
    finally:
        db.close()


def timers(store: str, computation: str, key: str) -> list[Timer]:
    """The timers pending for ``key`` in ``computation``, earliest first."""
    db = open_store(store, read_only=True)
    try:
        _computation(db, computation)
        pending = [Timer(t.tag, t.timestamp, t.domain) for t in db.timers(computation, key)]
        if not pending and db.state(computation, key) is None:
            _unknown_key(db, computation, key, has_timers=False)
        return pending
    finally:
        db.close()


def dead_letters(store: str, computation: str, *, unpickle: bool = False) -> list[Record]:
    """What ``computation`` sent to ``<computation>.dead_letter``: each value names the record (or
    timer), the key and the error (docs/architecture.md §3.11). Values are decoded as ``state``
    decodes a pickled state: in full only with ``unpickle=True``."""
    db = open_store(store, read_only=True)
    try:
        spec = _computation(db, computation)
        stream = f"{computation}.dead_letter"
        if spec.get("on_error", "dead_letter") != "dead_letter" or not db.stream_producers(stream):
            raise OptionError(f"Computation {computation!r} sends no dead letters", got=spec.get("on_error"),
                              hint="add it with on_error='dead_letter' to route the records its code cannot "
                                   "handle to the stream " + repr(stream))
        out: list[Record] = []
        for producer in db.stream_producers(stream):
            last = db.latest_batch(producer)
            if last is not None:
                out.extend(stored_records(db, stream, producer, 0, last.batch, unpickle))
        return out
    finally:
        db.close()


def stored_records(db: Store, stream: str, producer: str, after: int, upto: int, unpickle: bool) -> Iterator[Record]:
    """``producer``'s records on ``stream`` in batches (after, upto], values as ``shown_value`` shows them."""
    for _, seg in db.read_segment_columns(stream, producer, after, upto):
        values = [shown_value(v, unpickle) for v in seg.raw_values]
        yield from (Record(*r) for r in zip(seg.keys, values, seg.timestamps, seg.ids))  # type: ignore[arg-type]


def _computation(db: Store, name: str) -> dict[str, Any]:
    """The recorded spec of computation ``name`` (empty if it ran without one); an error that lists
    the computations the store knows if it knows no such computation."""
    for graph in recorded_graphs(db):
        if name in graph["computations"]:
            return dict(graph["computations"][name])
    known = db.computations()
    if name not in known:
        raise OptionError(f"No computation {name!r} in {db.shown_url}", got=name,
                          hint=f"known computations are {sorted(known)}" if known else
                          "nothing has run on this store yet: run the topology first, or check --store")
    return {}


def _codec(name: str, spec: dict[str, Any], given: str | Codec | None) -> Codec:
    if given is not None:
        return codec_named(given)
    recorded = spec.get("codec")
    if recorded in CODECS:
        return CODECS[recorded]
    raise OptionError(f"The store does not know how to decode the state of {name!r}",
                      got_text=f"codec {recorded!r}" if recorded else "no codec recorded for it",
                      hint="pass the codec it was added with: codec='pickle', 'json', 'msgpack', 'bytes' or your "
                           "headrace.codecs.Codec")


def _unknown_key(db: Store, computation: str, key: str, has_timers: bool) -> None:
    if has_timers:
        return
    keys = sorted(set(db.state_keys(computation)) | set(db.timer_keys(computation)))[:10]
    raise OptionError(f"Computation {computation!r} holds neither state nor timers for key {key!r}", got=key,
                      hint=f"keys it holds include {keys}" if keys else "it holds no key at all yet")
