"""``headrace.run`` and ``headrace.read``: the two entry points a user calls."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from .model import Record
from .errors import OptionError, UnknownStreamError
from .store import DEFAULT_STORE_URL, BatchInfo, open_store
from .topology import Topology

__all__ = ["run", "read", "watermarks"]


MODES = ("microbatch", "continuous")


def run(topology: Topology, store: str = DEFAULT_STORE_URL, master: str = "local[*]", *,
        checkpoint_dir: str | None = None, trigger_ms: int | None = None, progress: TextIO | None = sys.stderr,
        timeout_s: float | None = None, spark: Any = None, retention_ms: int | None = None,
        mode: str = "continuous", metrics_port: int | None = None, dashboard_port: int | None = None) -> Any:
    """Run ``topology`` on Spark with its state in ``store``.

    ``mode="continuous"`` (the default) runs long-lived workers that own key intervals and deliver each record
    as soon as its producer commits; ``mode="microbatch"`` runs a Structured Streaming query per
    computation, each batch a Spark job (docs/architecture.md §4). Returns a ``RunResult`` once every computation
    has drained, when all injectors are bounded; otherwise runs until stopped (Ctrl-C). Running
    again with the same store resumes. ``retention_ms`` bounds how long committed segments of
    every stream are kept (micro-batch mode). ``metrics_port`` serves Prometheus metrics on
    ``http://<driver>:<port>/metrics`` while it runs (0: a free port; None, the default: none).
    ``dashboard_port`` serves the web dashboard on 127.0.0.1 at that port (0: any free port) while
    the run lasts and prints its URL to ``progress``; ``None`` (the default) opens no port.
    """
    if mode not in MODES:
        raise OptionError("Unknown execution mode", got=mode,
                          hint="mode='microbatch' (a Spark query per computation) or mode='continuous' "
                               "(long-lived workers, millisecond latency)")
    if dashboard_port is not None:
        from .dashboard import check_port

        check_port(dashboard_port)  # before Spark starts
    if mode == "continuous":
        given = [n for n, v in (("checkpoint_dir", checkpoint_dir), ("trigger_ms", trigger_ms),
                                ("retention_ms", retention_ms)) if v is not None]
        if given:
            raise OptionError(f"{given[0]} applies to mode='microbatch' only", got=mode,
                              hint="drop it, or run with mode='microbatch'")
        from .spark.continuous import ContinuousRunner

        runner: Any = ContinuousRunner(topology, store, master, spark=spark, progress=progress,
                                                metrics_port=metrics_port).start()
    else:
        from .spark.runner import SparkRunner

        runner = SparkRunner(topology, store, master, checkpoint_dir=checkpoint_dir, trigger_ms=trigger_ms or 200,
                             progress=progress, spark=spark, retention_ms=retention_ms,
                             metrics_port=metrics_port).start()
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


def read(stream: str, store: str = DEFAULT_STORE_URL, *, from_batch: int = 0,
         since_ms: int | None = None) -> list[Record]:
    """The committed records of ``stream``, producer by producer, in batch order.

    Replay part of it with ``from_batch`` (the producers' batches after it) or ``since_ms`` (the
    batches completed at or after that time). A record's ``key`` is the key its producer gave
    (``None`` when it gave none).
    """
    db = open_store(store)
    try:
        producers = db.stream_producers(stream)
        if not producers:
            known = db.streams()
            raise UnknownStreamError(f"No producer writes stream {stream!r} in {db.shown_url}", got=stream,
                                     hint=f"known streams are {known}" if known else
                                     "nothing has run on this store yet: run the topology first, or check store=")
        out: list[Record] = []
        for producer in producers:
            last = db.latest_batch(producer)
            if last is None:
                continue
            after = from_batch if since_ms is None else max(from_batch, db.batch_before(producer, since_ms))
            out.extend(Record(r.key, r.value, r.timestamp, r.id)  # type: ignore[arg-type]
                       for _, r in db.read_segments(stream, producer, after, last.batch))
        return out
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
