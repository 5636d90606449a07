"""``Harness``: one computation on the real engine and the SQLite store, driven by hand, no Spark.

>>> from headrace import Computation
>>> from headrace.testing import Harness
>>> class Count(Computation):
...     def process_record(self, ctx, record):
...         ctx.state = (ctx.state or 0) + 1
...         ctx.set_timer("flush", 1000)
...     def process_timer(self, ctx, timer):
...         ctx.produce("counts", {"key": ctx.key, "n": ctx.state})
>>> h = Harness(Count)
>>> _ = h.process("a", "x", 10); _ = h.process("a", "y", 20)
>>> h.state("a"), h.timers("a")
(2, [Timer(tag='flush', timestamp=1000, domain='watermark')])
>>> _ = h.advance_watermark(1000)
>>> [r.value for r in h.productions("counts")]
[{'key': 'a', 'n': 2}]
"""

from __future__ import annotations

import atexit
import itertools
import shutil
import tempfile
from typing import Any, Iterable, Mapping, Sequence, cast

import pyarrow as pa

from .engine import DedupCache, InputRecord, run_batch
from .engine.consumer import Consumer, plan_ranges
from .engine.intake import gather
from .engine.failures import construct, poison_input
from .engine.publish import publish_injected
from .engine.routing import RoutingPlan, Subscriber
from .injectors import timestamper
from .names import injector
from .errors import InvalidKeyError, OptionError
from .model import BEGINNING_OF_TIME, Computation, ComputationOptions, Record, Timer, Timestamp, to_millis
from .schema import StreamSchema
from .store import Store, open_store
from .names import check_name
from .topology import as_extractor, check_computation_class

__all__ = ["Harness"]

# The harness's one input stream. Its records come from the test's hand, which may repeat an id on
# purpose: the stream counts as delivered at least once, so ids already seen are discarded.
HARNESS_STREAM = "input"


class Harness:
    """Run one computation deterministically: ``process``, ``advance_watermark``, ``advance_wall_clock``.

    Each call is one committed batch. ``store`` defaults to a fresh SQLite file in a temporary
    folder; pass a URL to keep it (a second Harness on the same URL resumes where it stopped).
    ``outputs`` restricts the streams the computation may produce to (any, by default).
    ``schemas`` (``{stream: Spark DDL or pyarrow.Schema}``) types streams as
    ``Topology.stream(..., schema=...)`` does: productions to them and input values of them
    (the input stream is ``"input"``) are checked, a misfit handled under ``on_error``.
    """

    def __init__(self, cls: type[Computation], *, name: str | None = None, outputs: list[str] | None = None,
                 store: str | None = None, schemas: Mapping[str, str | pa.Schema] | None = None, **options: Any):
        label = check_name("computation", name or getattr(cls, "__name__", "computation"))
        self.cls = check_computation_class(label, cls)
        self.name = label
        self.options = ComputationOptions.from_kwargs(label, self.cls.resolve_options(label, dict(options)))
        self._computation = construct(cls, label)  # before the store is opened: it may raise
        self.outputs = frozenset(outputs) if outputs is not None else None
        if schemas is not None and not isinstance(schemas, Mapping):
            raise OptionError("Harness schemas are a dict of stream name to schema", got=schemas,
                              hint="e.g. schemas={'input': 'user STRING, n BIGINT'}")
        self.schemas = {check_name("stream", s): StreamSchema(v) for s, v in (schemas or {}).items()}
        if store is None:
            folder = tempfile.mkdtemp(prefix="headrace-harness-")
            atexit.register(shutil.rmtree, folder, True)
            store = f"sqlite:///{folder}/harness.db"
        self.store: Store = open_store(store)
        self.store.register(label, self.options.shards)
        self.sequencer = self.store.acquire_writer(label)
        journal = self.store.batches(label)
        last = journal[-1] if journal else None
        self._batch = max([last.batch if last else 0, *self.store.shard_versions(label).values()])
        self._watermark = last.input_watermark if last else BEGINNING_OF_TIME
        self._output_watermark = last.output_watermark if last else BEGINNING_OF_TIME
        self._wall_clock = 0
        self._ids = itertools.count(1)
        self._dedup = DedupCache()
        self._streams = {HARNESS_STREAM}  # every input stream used so far: all count as at-least-once

    # -- driving --------------------------------------------------------------------------------

    def process(self, key: str, value: Any, timestamp: Timestamp, id: str | None = None,
                stream: str = HARNESS_STREAM) -> list[Record]:
        """Deliver one record of input ``stream`` to the computation under ``key``; returns what
        this step produced."""
        return self.process_batch([(key, value, timestamp, id)], stream)

    def process_batch(self, records: Iterable[tuple[str, Any, Timestamp] | tuple[str, Any, Timestamp, str | None]],
                      stream: str = HARNESS_STREAM) -> list[Record]:
        """Deliver ``(key, value, timestamp[, id])`` records of input ``stream`` as one batch (a
        commit per shard), as a runner delivers what it read in one pass; returns what the batch
        produced.

        >>> from headrace import Computation
        >>> class Total(Computation):
        ...     def process_record(self, ctx, record):
        ...         ctx.state = (ctx.state or 0) + record.value
        >>> h = Harness(Total)
        >>> _ = h.process_batch([("a", 1, 10), ("b", 5, 11), ("a", 2, 12)])
        >>> h.state("a"), h.state("b"), h.counters["records"]
        (3, 5, 3)
        """
        name = check_name("stream", stream)
        taken: list[InputRecord] = []
        rejected: list[InputRecord] = []
        for fields in records:
            if not 3 <= len(fields) <= 4:
                raise OptionError("A harness record is (key, value, timestamp) or (key, value, timestamp, id)",
                                  got_text=repr(fields), hint="give each record three or four fields")
            key, value, timestamp, *given = fields
            if type(key) is not str:
                raise InvalidKeyError("A harness record needs a str key", got_text=f"{key!r} of type {type(key).__name__}",
                                      hint="pass the key as a string, e.g. str(user_id)")
            rid = given[0] if given and given[0] is not None else f"harness-{self.name}-{next(self._ids)}"
            record = InputRecord(name, key, value, to_millis(timestamp), rid)
            poison = poison_input(self.name, self.options.on_error, record)  # as no store could hold it
            if poison is None:
                taken.append(record)
            else:
                rejected.append(poison)
        self._streams.add(name)
        return self._run(taken, self._watermark, rejected)

    def inject(self, stream: str, values: Sequence[Any], *, key: Any, timestamp: Any,
               watermark: Timestamp | None = None) -> list[Record]:
        """Publish ``values`` as the next batch of ``stream``'s injector (``timestamp``: a field name
        or a function, as ``injectors.records`` takes it), routed for this computation by ``key``
        (a ``key_by``), and take it as the runners do, through the one intake: a record whose key
        cannot be extracted or whose value cannot be decoded is bad input, failed or dead-lettered
        under ``on_error``. ``watermark`` is the injector's with this batch (default: unchanged)."""
        check_name("stream", stream)
        extractor = as_extractor(self.name, stream, key)
        producer = injector(stream)
        plan = RoutingPlan({stream: (Subscriber(self.name, extractor, self.options.shards),)})
        self.store.register_plan(plan.id, plan.routes)
        last = self.store.latest_batch(producer)
        batch = last.batch + 1 if last else 1
        stamp = timestamper(timestamp)
        mark = self._watermark if watermark is None else to_millis(watermark, "watermark")
        publish_injected(self.store, producer, batch, stream, [(v, stamp(v), None) for v in values], mark, None,
                         self.schemas.get(stream), plan, batch)
        consumer = Consumer(self.name, self.options, {stream: extractor}, {stream: (producer,)},
                            schemas={s: c for s, c in self.schemas.items() if s == stream})
        ranges = plan_ranges(self.store, consumer, {producer: batch - 1}, self.store.producer_heads([producer]), {})
        mine, bad = gather(self.store, consumer, ranges, None)
        taken = [r for rs in mine.values() for r in rs]
        rejected = [r for rs in bad.values() for r in rs]
        return self._run(taken, max(self._watermark, self.store.latest_batch(producer).output_watermark),  # type: ignore[union-attr]
                         rejected)

    def advance_watermark(self, timestamp: Timestamp) -> list[Record]:
        """Move the input low watermark to ``timestamp``; fires every watermark timer now due."""
        target = to_millis(timestamp, "watermark")
        if target < self._watermark:
            raise OptionError("A low watermark never moves back", got=target,
                              hint=f"advance to {self._watermark} or later")
        return self._run([], target)

    def advance_wall_clock(self, timestamp: Timestamp) -> list[Record]:
        """Move the wall clock to ``timestamp``; fires every wall timer now due."""
        target = to_millis(timestamp, "wall clock")
        if target < self._wall_clock:
            raise OptionError("The harness wall clock never moves back", got=target,
                              hint=f"advance to {self._wall_clock} or later")
        self._wall_clock = target
        return self._run([], self._watermark)

    def _run(self, records: list[InputRecord], watermark_after: int, rejected: Sequence[InputRecord] = ()) -> list[Record]:
        self._batch += 1
        outcome = run_batch(self._computation, self.name, self.options, self.outputs, self.store, self.store,
                            batch=self._batch, records=records, watermark_before=self._watermark,
                            watermark_after=watermark_after, wall_clock=self._wall_clock,
                            sequencer=self.sequencer, previous_output=self._output_watermark,
                            dedup_streams=frozenset(self._streams), dedup_cache=self._dedup,
                            schemas=self.schemas, rejected=rejected)
        self._output_watermark = outcome.output_watermark
        self._watermark = watermark_after
        return [Record(cast(str, p.key), p.value, p.timestamp, p.id) for p in outcome.productions]  # a hint: may be None

    # -- reading back -------------------------------------------------------------------------------

    def productions(self, stream: str) -> list[Record]:
        """Everything produced to ``stream`` so far, in production order."""
        return [Record(cast(str, r.key), r.value, r.timestamp, r.id)  # the producer's key hint: may be None
                for _, r in self.store.read_segments(stream, self.name, 0, self._batch)]

    def state(self, key: str) -> Any:
        raw = self.store.state(self.name, key)
        return None if raw is None else self.options.codec.decode(raw)

    def timers(self, key: str) -> list[Timer]:
        return [Timer(t.tag, t.timestamp, t.domain) for t in self.store.timers(self.name, key)]

    @property
    def counters(self) -> dict[str, int]:
        """Exact cumulative counters: records, late_dropped, late_delivered, duplicates, timers_fired, ..."""
        return self.store.counters(self.name)

    @property
    def low_watermark(self) -> int:
        """The computation's input low watermark."""
        return self._watermark

    @property
    def output_watermark(self) -> int:
        return self._output_watermark
