"""``headrace.run`` and ``headrace.read``: the two entry points a user calls."""

from __future__ import annotations

import sys
from itertools import islice
from typing import Any, Iterator, Sequence, TextIO

from .model import Record
from .errors import OptionError, UnknownStreamError
from .store import DEFAULT_STORE_URL, BatchInfo, Store, open_store
from .topology import Topology

__all__ = ["run", "read", "watermarks", "stream_df", "table_df"]


from .names import MODES


def run(topology: Topology, store: str = DEFAULT_STORE_URL, master: str = "local[*]", *,
        checkpoint_dir: str | None = None, trigger_ms: int | None = None, progress: TextIO | None = sys.stderr,
        timeout_s: float | None = None, spark: Any = None, retention_ms: int | None = None,
        mode: str = "continuous", metrics_port: int | None = None, dashboard_port: int | None = None,
        ui: bool = True, py_files: Sequence[str] = (), progress_queries: bool = False, rebalance: bool = True,
        workers: int | None = None) -> Any:
    """Run ``topology`` on Spark with its state in ``store``.

    ``mode="continuous"`` (the default) runs long-lived workers that own key intervals and deliver each record
    as soon as its producer commits; ``mode="microbatch"`` runs a Structured Streaming query per
    computation, each batch a Spark job (docs/architecture.md §4). Returns a ``RunResult`` once every computation
    has drained, when all injectors are bounded; otherwise runs until stopped (Ctrl-C). Running
    again with the same store resumes. ``retention_ms`` (either mode) is how long a stream's
    segments are kept for replay once every reader has read them (``Topology.stream`` sets it per stream). ``metrics_port`` serves Prometheus metrics on
    ``http://<driver>:<port>/metrics`` while it runs (0: a free port; None, the default: none).
    ``dashboard_port`` serves the web dashboard on 127.0.0.1 at that port (0: any free port) while
    the run lasts and prints its URL to ``progress``; ``None`` (the default) opens no port.
    Spark's web UI is on unless ``ui=False`` (or a given ``spark`` session has it off); the run
    prints its URL to ``progress`` and returns it as ``ui_url``. ``py_files`` (Python files, zips,
    eggs or package folders) are shipped to every executor before the first job, for user code
    that the executors cannot import otherwise (``headrace run`` ships the topology's own package).
    ``progress_queries=True`` puts each computation's numbers (watermarks, lag, records, late and
    dead-letter counts) in Spark's streaming progress events through a light query of its own
    (docs/monitoring.md); it is off by default, since in continuous mode it costs a task slot and
    latency (BENCHMARKS.md). ``workers`` (continuous mode) is how many long-lived workers run, each
    a Spark task that owns key intervals; by default one per task slot the run leaves free (the
    cluster's slots less those its Spark queries need).
    """
    if workers is not None and (type(workers) is not int or workers < 1):
        raise OptionError("workers must be a whole number of at least 1", got=workers,
                          hint="the number of continuous workers, each a Spark task that owns key intervals; leave "
                               "it out for one per free task slot")
    if mode not in MODES:
        raise OptionError("Unknown execution mode", got=mode,
                          hint="mode='microbatch' (a Spark query per computation) or mode='continuous' "
                               "(long-lived workers, millisecond latency)")
    if dashboard_port is not None:
        from .dashboard import check_port

        check_port(dashboard_port)  # before Spark starts
    if mode == "continuous":
        _refuse_ignored(topology, checkpoint_dir, trigger_ms, progress_queries)
        from .spark.continuous import ContinuousRunner

        runner: Any = ContinuousRunner(topology, store, master, spark=spark, progress=progress,
                                       metrics_port=metrics_port, ui=ui, py_files=py_files,
                                       progress_queries=progress_queries, checkpoint_dir=checkpoint_dir,
                                       trigger_ms=trigger_ms or 200, retention_ms=retention_ms,
                                       rebalance=rebalance, workers=workers).start()
    else:
        if rebalance is not True:
            raise OptionError("rebalance=False applies to continuous mode only", got=rebalance,
                              hint="micro-batch mode has no live rebalancing: leave rebalance out, or run "
                                   "mode='continuous'")
        if workers is not None:
            raise OptionError("workers applies to continuous mode only", got=workers,
                              hint="micro-batch mode runs a Spark query per computation, a task per key shard: "
                                   "leave workers out, or run mode='continuous'")
        from .spark.runner import MicroBatchRunner

        runner = MicroBatchRunner(topology, store, master, checkpoint_dir=checkpoint_dir, trigger_ms=trigger_ms or 200,
                                  progress=progress, spark=spark, retention_ms=retention_ms,
                                  metrics_port=metrics_port, ui=ui, py_files=py_files,
                                  progress_queries=progress_queries).start()
    dashboard = None
    try:
        if dashboard_port is not None:
            from .dashboard import Dashboard

            dashboard = Dashboard(store, port=dashboard_port).start()
            if progress is not None:
                print(f"headrace: dashboard at {dashboard.url}", file=progress, flush=True)
        return runner.wait(timeout_s)
    finally:
        runner.stop()
        if dashboard is not None:
            dashboard.stop()


def _refuse_ignored(topology: Topology, checkpoint_dir: str | None, trigger_ms: int | None,
                    progress_queries: bool) -> None:
    """Continuous mode runs no Spark query of its own: ``checkpoint_dir`` and ``trigger_ms`` apply
    only to the Spark queries a topology brings (sinks, streaming-DataFrame injectors, progress
    queries), and weak productions would change nothing (an interval's productions become visible
    with its commit either way). An option that would change nothing is refused, not ignored."""
    from .spark.inject import is_streaming_dataframe
    from .spark.sinks import spark_sinks

    queries = spark_sinks(topology) or progress_queries or any(
        is_streaming_dataframe(i.source) for i in topology.injections.values())
    for option, value in (("checkpoint_dir", checkpoint_dir), ("trigger_ms", trigger_ms)):
        if value is not None and not queries:
            raise OptionError(f"{option} applies to the Spark queries of a run, and this continuous run has none",
                              got=value, hint="drop it: continuous mode's workers run no query (file, JDBC and "
                                              "foreach_batch sinks, streaming-DataFrame injectors and progress "
                                              "queries do)")
    weak = [s.name for s in topology.computations.values()
            if s.options.productions == "weak" and s.options.state_semantics == "exactly_once"]
    if weak:
        raise OptionError(f"Computation {weak[0]!r}: productions='weak' changes nothing in continuous mode", got="weak",
                          hint="an interval's productions become visible with its commit either way: drop it, or "
                               "run with mode='microbatch', where weak productions are sent ahead of the commit")


def read(stream: str, store: str = DEFAULT_STORE_URL, *, from_batch: int = 0,
         since_ms: int | None = None, limit: int | None = None, unpickle: bool = True) -> Iterator[Record]:
    """The committed records of ``stream``, producer by producer, in batch order, as an iterator
    (``list(read(...))`` for a list); at most ``limit`` of them when it is given.

    Replay part of it with ``from_batch`` (the producers' batches after it) or ``since_ms`` (the
    batches completed at or after that time). A record's ``key`` is the key its producer gave
    (``None`` when it gave none). A stream no producer writes is refused here, before iterating.
    Values are unpickled (this is how a program reads its outputs); ``unpickle=False`` decodes
    only plain data and shows any other value as ``codecs.Pickled`` (``headrace read`` without
    ``--unpickle``: a store written by someone else runs no code of theirs, docs/security.md).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise OptionError("read(limit=...) must be an integer >= 0 or None", got=limit,
                          hint="e.g. read('counts', store=..., limit=10)")
    db = open_stream(store, stream)
    try:
        heads = [(p, db.latest_batch(p)) for p in db.stream_producers(stream)]
        ranges = [(p, from_batch if since_ms is None else max(from_batch, db.batch_before(p, since_ms)), last.batch)
                  for p, last in heads if last is not None]
        for producer, after, _ in ranges:
            db.check_replay(stream, producer, after)  # refused when retention forgot part of what was asked
    except BaseException:
        db.close()
        raise
    records = _records(db, stream, ranges, unpickle)
    return records if limit is None else islice(records, limit)


def open_stream(store: str, stream: str) -> Store:
    """The store, open, once it is known that some producer writes ``stream``."""
    db = open_store(store, read_only=True)
    if not db.stream_producers(stream):
        known = db.streams()
        db.close()
        raise UnknownStreamError(f"No producer writes stream {stream!r} in {db.shown_url}", got=stream,
                                 hint=f"known streams are {known}" if known else
                                 "nothing has run on this store yet: run the topology first, or check store=")
    return db


def stream_df(stream: str, *, spark: Any, store: str = DEFAULT_STORE_URL, start: str | int = "beginning",
              from_batch: int = 0) -> Any:
    """A streaming DataFrame of ``stream``'s committed records, from ``start`` (``"beginning"``,
    ``"now"``, or a time in ms since the epoch: the batches completed from then on) or after each
    producer's batch ``from_batch``. Columns: ``key``, ``value`` (pickled bytes, or a struct of
    typed columns when the stream has a schema), ``timestamp`` (ms), ``id``, ``producer``, ``batch``."""
    return _frame(stream, spark, store, start, from_batch, streaming=True)


def table_df(stream: str, *, spark: Any, store: str = DEFAULT_STORE_URL, start: str | int = "beginning",
             from_batch: int = 0) -> Any:
    """``stream_df``'s records committed so far, as a batch DataFrame."""
    return _frame(stream, spark, store, start, from_batch, streaming=False)


def _frame(stream: str, spark: Any, store: str, start: str | int, from_batch: int, *, streaming: bool) -> Any:
    if not (start in ("beginning", "now") or (isinstance(start, int) and not isinstance(start, bool))):
        raise OptionError("A stream DataFrame starts from 'beginning', 'now' or a time in ms since the epoch",
                          got=start, hint="start='beginning', or from_batch=N to skip each producer's first N batches")
    if isinstance(from_batch, bool) or not isinstance(from_batch, int) or from_batch < 0:
        raise OptionError("from_batch must be an integer >= 0", got=from_batch, hint="e.g. from_batch=10")
    from .spark.frames import schema_key, stream_frame

    db = open_stream(store, stream)
    try:
        ddl, url = db.get_meta(schema_key(stream)) or "", db.url
    finally:
        db.close()
    return stream_frame(spark, stream, url, ddl, streaming=streaming, start=start, from_batch=from_batch)


def _records(db: Store, stream: str, ranges: list[tuple[str, int, int]], unpickle: bool) -> Iterator[Record]:
    from .monitor.inspect import stored_records

    try:
        for producer, after, upto in ranges:
            yield from stored_records(db, stream, producer, after, upto, unpickle)
    finally:
        db.close()


def watermarks(store: str = DEFAULT_STORE_URL) -> dict[str, BatchInfo]:
    """The low watermarks journaled in ``store``: per producer (computation or ``inject:<stream>``),
    its latest completed batch with its input and output low watermark."""
    db = open_store(store, read_only=True)
    try:
        return {info.producer: info for info in db.journal_heads()}
    finally:
        db.close()
