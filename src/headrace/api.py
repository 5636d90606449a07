"""``headrace.run`` and ``headrace.read``: the two entry points a user calls."""

from __future__ import annotations

import sys
from itertools import islice
from typing import Any, Iterator, TextIO

from .model import Record
from .errors import OptionError, UnknownStreamError
from .store import DEFAULT_STORE_URL, BatchInfo, Store, open_store
from .topology import Topology

__all__ = ["run", "read", "watermarks"]


MODES = ("microbatch", "continuous")


def run(topology: Topology, store: str = DEFAULT_STORE_URL, master: str = "local[*]", *,
        checkpoint_dir: str | None = None, trigger_ms: int | None = None, progress: TextIO | None = sys.stderr,
        timeout_s: float | None = None, spark: Any = None, retention_ms: int | None = None,
        mode: str = "continuous") -> Any:
    """Run ``topology`` on Spark with its state in ``store``.

    ``mode="continuous"`` (the default) runs long-lived workers that own key intervals and deliver each record
    as soon as its producer commits; ``mode="microbatch"`` runs a Structured Streaming query per
    computation, each batch a Spark job (docs/architecture.md §4). Returns a ``RunResult`` once every computation
    has drained, when all injectors are bounded; otherwise runs until stopped (Ctrl-C). Running
    again with the same store resumes. ``retention_ms`` bounds how long committed segments of
    every stream are kept (micro-batch mode).
    """
    if mode not in MODES:
        raise OptionError("Unknown execution mode", got=mode,
                          hint="mode='microbatch' (a Spark query per computation) or mode='continuous' "
                               "(long-lived workers, millisecond latency)")
    if mode == "continuous":
        given = [n for n, v in (("checkpoint_dir", checkpoint_dir), ("trigger_ms", trigger_ms),
                                ("retention_ms", retention_ms)) if v is not None]
        if given:
            raise OptionError(f"{given[0]} applies to mode='microbatch' only", got=mode,
                              hint="drop it, or run with mode='microbatch'")
        from .spark.continuous import ContinuousRunner

        runner: Any = ContinuousRunner(topology, store, master, spark=spark, progress=progress).start()
    else:
        from .spark.runner import SparkRunner

        runner = SparkRunner(topology, store, master, checkpoint_dir=checkpoint_dir, trigger_ms=trigger_ms or 200,
                             progress=progress, spark=spark, retention_ms=retention_ms).start()
    try:
        return runner.wait(timeout_s)
    finally:
        runner.stop()


def read(stream: str, store: str = DEFAULT_STORE_URL, *, from_batch: int = 0,
         since_ms: int | None = None, limit: int | None = None) -> Iterator[Record]:
    """The committed records of ``stream``, producer by producer, in batch order, as an iterator
    (``list(read(...))`` for a list); at most ``limit`` of them when it is given.

    Replay part of it with ``from_batch`` (the producers' batches after it) or ``since_ms`` (the
    batches completed at or after that time). A record's ``key`` is the key its producer gave
    (``None`` when it gave none). A stream no producer writes is refused here, before iterating.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise OptionError("read(limit=...) must be an integer >= 0 or None", got=limit,
                          hint="e.g. read('counts', store=..., limit=10)")
    db = open_store(store)
    try:
        producers = db.stream_producers(stream)
        if not producers:
            known = db.streams()
            raise UnknownStreamError(f"No producer writes stream {stream!r} in {db.shown_url}", got=stream,
                                     hint=f"known streams are {known}" if known else
                                     "nothing has run on this store yet: run the topology first, or check store=")
        heads = [(p, db.latest_batch(p)) for p in producers]
        ranges = [(p, from_batch if since_ms is None else max(from_batch, db.batch_before(p, since_ms)), last.batch)
                  for p, last in heads if last is not None]
    except BaseException:
        db.close()
        raise
    records = _records(db, stream, ranges)
    return records if limit is None else islice(records, limit)


def _records(db: Store, stream: str, ranges: list[tuple[str, int, int]]) -> Iterator[Record]:
    try:
        for producer, after, upto in ranges:
            for _, r in db.read_segments(stream, producer, after, upto):
                yield Record(r.key, r.value, r.timestamp, r.id)  # type: ignore[arg-type]
    finally:
        db.close()


def watermarks(store: str = DEFAULT_STORE_URL) -> dict[str, BatchInfo]:
    """The low watermarks journaled in ``store``: per producer (computation or ``inject:<stream>``),
    its latest completed batch with its input and output low watermark."""
    db = open_store(store)
    try:
        return {info.producer: info for info in db.journal_heads()}
    finally:
        db.close()
