"""The graph: injected streams, computations, and who subscribes to what.

Everything is checked as it is added, so a wrong topology fails where it is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from .errors import OptionError, TopologyError
from .model import Computation, ComputationOptions, KeyExtractor, MonoidComputation
from .schema import StreamSchema
from .names import check_name
from .sinkspec import SinkSpec, parse_sink

__all__ = ["Topology", "ComputationSpec", "Injection", "InjectOptions", "SinkSpec"]



DELIVERIES = ("exactly_once", "at_least_once")
DATAFRAME_OPTIONS = ("timestamp", "max_delay_ms", "id", "bounded")


@dataclass(frozen=True)
class InjectOptions:
    """Options of ``Topology.inject(stream, source, **options)``.

    - ``delivery``: ``"exactly_once"`` (default) when the source never sends a record twice, or
      ``"at_least_once"`` when it may send one again (with the same id, e.g. after its own retry):
      every consumer of the stream then discards ids it has already seen (MillWheel §5.2; the
      ``dedup`` computation option, on by default, allows it).
    - For a Spark streaming DataFrame only: ``timestamp`` (its event-time column, required),
      ``max_delay_ms`` (how far behind the newest row a row may still arrive; the watermark is the
      newest timestamp minus this), ``id`` (a column holding record ids; by default ids are
      positional), ``bounded`` (read what is there with ``availableNow`` and end with the end of time).
    """

    delivery: str = "exactly_once"
    timestamp: str | None = None
    max_delay_ms: int = 0
    id: str | None = None
    bounded: bool = False

    @classmethod
    def parse(cls, stream: str, source: Any, options: Mapping[str, Any]) -> "InjectOptions":
        dataframe = getattr(source, "isStreaming", False) is True
        allowed = ("delivery", *DATAFRAME_OPTIONS) if dataframe else ("delivery",)
        for name, value in options.items():
            if name not in allowed:
                extra = "" if dataframe else f"; {list(DATAFRAME_OPTIONS)} apply to a streaming DataFrame only"
                raise OptionError(f"Stream {stream!r}: unknown injector option {name!r}", got=value,
                                  hint=f"valid options are {list(allowed)}{extra}")
        parsed = cls(**options)
        if parsed.delivery not in DELIVERIES:
            raise OptionError(f"Stream {stream!r}: option 'delivery' must be one of {list(DELIVERIES)}",
                              got=parsed.delivery, hint="write delivery='at_least_once' for a source that may repeat records")
        if dataframe:
            columns = list(getattr(source, "columns", []))
            for name in ("timestamp", "id"):
                column = getattr(parsed, name)
                if (name == "timestamp" or column is not None) and column not in columns:
                    raise OptionError(f"Stream {stream!r} needs a column of the DataFrame as {name}=", got=column,
                                      hint=f"the columns are {columns}")
            if isinstance(parsed.max_delay_ms, bool) or not isinstance(parsed.max_delay_ms, int) \
                    or parsed.max_delay_ms < 0:
                raise OptionError(f"Stream {stream!r}: option 'max_delay_ms' must be an integer >= 0",
                                  got=parsed.max_delay_ms, hint="e.g. max_delay_ms=5000")
            if not isinstance(parsed.bounded, bool):
                raise OptionError(f"Stream {stream!r}: option 'bounded' must be True or False", got=parsed.bounded)
        return parsed


@dataclass(frozen=True)
class Injection:
    stream: str
    source: Any
    options: InjectOptions = field(default_factory=InjectOptions)

    @property
    def producers(self) -> list[str]:
        """The journal names this stream's injector publishes under: one per part."""
        parts = getattr(self.source, "parts", None)
        if parts is None:
            return [f"inject:{self.stream}"]
        return [f"inject:{self.stream}/{i}" for i in range(len(parts))]


@dataclass(frozen=True)
class ComputationSpec:
    """One computation node: its class, subscriptions (stream -> key extractor), outputs and options."""

    name: str
    cls: type[Computation]
    inputs: Mapping[str, KeyExtractor]
    outputs: tuple[str, ...]
    options: ComputationOptions


def check_retention(what: str, value: object) -> int:
    """A replay window: a whole number of ms, at least 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionError(f"{what}: retention_ms must be a whole number of milliseconds >= 0", got=value,
                          hint="e.g. retention_ms=3_600_000 keeps an hour of read segments for replay")
    return value


def as_extractor(owner: str, stream: str, extractor: object) -> KeyExtractor:
    if isinstance(extractor, KeyExtractor):
        return extractor
    if isinstance(extractor, str):
        raise TopologyError(
            f"Computation {owner!r} subscribes to {stream!r} with a plain string as key extractor",
            got=extractor,
            hint=f"wrap it: inputs={{{stream!r}: key_by({extractor!r})}}",
        )
    if not callable(extractor):
        raise TopologyError(
            f"Computation {owner!r} subscribes to {stream!r} with a key extractor that is not callable",
            got_text=f"{extractor!r} of type {type(extractor).__name__}",
            hint="use key_by('field') or key_by(lambda value: ...)",
        )
    name = getattr(extractor, "__qualname__", repr(extractor))
    return KeyExtractor(extractor, f"key_by({name})")


def check_computation_class(owner: str, cls: object) -> type[Computation]:
    if not (isinstance(cls, type) and issubclass(cls, Computation)):
        raise TopologyError(
            f"Computation {owner!r} must be a subclass of headrace.Computation",
            got=cls,
            hint="write `class MyComputation(Computation): def process_record(self, ctx, record): ...`",
        )
    if issubclass(cls, MonoidComputation):
        missing = cls.missing_hooks()
        if missing:
            raise TopologyError(
                f"Monoid computation {owner!r} does not define {', '.join(missing)}",
                got=cls,
                hint="a MonoidComputation defines zero(), lift(record), combine(a, b) and emit(ctx, timer, aggregate)",
            )
        if cls.overrides("process_record") or cls.overrides("process_timer"):
            raise TopologyError(
                f"Monoid computation {owner!r} defines process_record or process_timer",
                got=cls,
                hint="a MonoidComputation folds records with lift and combine and produces in emit; "
                     "subclass Computation for per-record code",
            )
        return cls
    if not (cls.overrides("process_record") or cls.overrides("process_timer")):
        raise TopologyError(
            f"Computation {owner!r} defines neither process_record nor process_timer",
            got=cls,
            hint="override process_record(self, ctx, record) and/or process_timer(self, ctx, timer)",
        )
    return cls


class Topology:
    """A named graph of injected streams and computations.

    >>> from headrace import Computation, Topology, key_by
    >>> class Echo(Computation):
    ...     def process_record(self, ctx, record):
    ...         ctx.produce("out", record.value)
    >>> t = Topology("demo")
    >>> t.inject("words", [{"w": "a"}])
    >>> t.add(Echo, inputs={"words": key_by("w")}, outputs=["out"]).name
    'Echo'
    """

    def __init__(self, name: str):
        self.name = check_name("topology", name)
        self.injections: dict[str, Injection] = {}
        self.computations: dict[str, ComputationSpec] = {}
        self.schemas: dict[str, StreamSchema] = {}
        self.retention: dict[str, int] = {}  # a stream's replay window in ms, over the run's
        self.sinks: dict[str, SinkSpec] = {}

    # -- building -------------------------------------------------------------------------------

    def inject(self, stream: str, source: Any, **options: Any) -> None:
        """Declare ``stream`` as fed by an injector ``source`` (see ``headrace.injectors``); the
        options are ``InjectOptions``' (``delivery``, and a streaming DataFrame's own), checked here."""
        check_name("stream", stream)
        if stream in self.injections:
            raise TopologyError(
                f"Stream {stream!r} is already injected in topology {self.name!r}",
                got=source,
                hint="give the second injector its own stream name, or merge the sources into one",
            )
        if source is None:
            raise TopologyError(
                f"Stream {stream!r} needs an injector source",
                got=None,
                hint="pass an iterable of records, headrace.injectors.files(...), .generator(...) or a streaming DataFrame",
            )
        self.injections[stream] = Injection(stream, source, InjectOptions.parse(stream, source, options))

    def add(
        self,
        cls: type[Computation],
        name: str | None = None,
        inputs: Mapping[str, KeyExtractor | Callable[[Any], Any]] | None = None,
        outputs: Iterable[str] = (),
        **options: Any,
    ) -> ComputationSpec:
        """Add a computation subscribing to ``inputs`` (stream -> key extractor), producing to ``outputs``."""
        label = name if name is not None else getattr(cls, "__name__", repr(cls))
        check_computation_class(label, cls)
        label = check_name("computation", label)
        if label in self.computations:
            raise TopologyError(
                f"Topology {self.name!r} already has a computation named {label!r}",
                got=cls,
                hint="pass a distinct name: topology.add(cls, name='...')",
            )
        if not inputs:
            raise TopologyError(
                f"Computation {label!r} subscribes to no stream",
                got=inputs,
                hint="pass inputs={'stream': key_by('field')}",
            )
        known = self.streams()
        subscriptions: dict[str, KeyExtractor] = {}
        for stream, extractor in dict(inputs).items():
            check_name("stream", stream)
            if stream not in known:
                raise TopologyError(
                    f"Computation {label!r} subscribes to unknown stream {stream!r}",
                    got=stream,
                    hint=f"known streams are {sorted(known)}; inject it, or add its producer first",
                )
            subscriptions[stream] = as_extractor(label, stream, extractor)
        if isinstance(outputs, str):
            raise TopologyError(
                f"Computation {label!r} outputs must be a list of stream names",
                got=outputs,
                hint=f"write outputs=[{outputs!r}]",
            )
        outs = tuple(dict.fromkeys(check_name("stream", s) for s in outputs))
        parsed = ComputationOptions.from_kwargs(label, cls.resolve_options(label, dict(options)))
        for stream in parsed.watermark_percentile:
            if stream not in subscriptions:
                raise OptionError(f"Computation {label!r} sets a watermark percentile for {stream!r}, "
                                  "which it does not subscribe to", got=stream,
                                  hint=f"its inputs are {sorted(subscriptions)}")
        if parsed.on_error == "dead_letter":
            outs += (f"{label}.dead_letter",)
        spec = ComputationSpec(label, cls, subscriptions, outs, parsed)
        self._refuse_cycle(spec)
        self.computations[label] = spec
        return spec

    def stream(self, name: str, *, schema: Any = None, retention_ms: int | None = None) -> StreamSchema | None:
        """Declare what stream ``name`` (injected, or an output of a computation already added) is:
        its ``schema``, a Spark DDL string (``"user STRING, n BIGINT"``) or a ``pyarrow.Schema``
        (every value produced to it must then be a dict that fits; its DataFrame view has typed
        columns), and how long its read segments are kept for replay, ``retention_ms`` (over the
        run's ``retention_ms``). Returns its schema."""
        check_name("stream", name)
        if name not in self.streams():
            raise TopologyError(f"Topology {self.name!r} cannot declare stream {name!r}: nothing produces it",
                                got=name, hint=f"inject it or add its producer first; known streams are "
                                               f"{sorted(self.streams())}")
        if schema is None and retention_ms is None:
            raise OptionError(f"Stream {name!r}: stream() declares a schema= or a retention_ms=", got=None,
                              hint="e.g. topology.stream('events', schema='user STRING, n BIGINT')")
        if retention_ms is not None:
            self.retention[name] = check_retention(f"Stream {name!r}", retention_ms)
        if schema is not None:
            self.schemas[name] = StreamSchema(schema)
        return self.schemas.get(name)

    def sink(self, stream: str, *, name: str | None = None, **options: Any) -> SinkSpec:
        """Write ``stream``'s committed records out as the topology runs, exactly once per
        committed batch: ``format="parquet"|"json", path=...`` (Spark's file sink), ``jdbc=url,
        table=..., properties={"user": ..., "password": ...}`` (rows keyed by producer and batch,
        replaced when a batch is written again), or ``foreach_batch=fn`` (``fn(df, batch_id)``;
        a replayed ``batch_id`` carries the same records), ``delta=path`` or ``iceberg="ns.table",
        warehouse=path`` (``headrace/lake``). Rows have ``stream_df``'s columns."""
        check_name("stream", stream)
        if stream not in self.streams():
            raise TopologyError(f"Topology {self.name!r} cannot sink stream {stream!r}: nothing produces it",
                                got=stream, hint=f"known streams are {sorted(self.streams())}")
        spec = parse_sink(stream, name, options)
        if spec.name in self.sinks:
            raise TopologyError(f"Topology {self.name!r} already has a sink named {spec.name!r}", got=spec.name,
                                hint="pass a distinct name: topology.sink(stream, name='...', ...)")
        self.sinks[spec.name] = spec
        return spec

    def schemas_of(self, names: Iterable[str]) -> dict[str, StreamSchema]:
        """The schemas of the typed streams among ``names``."""
        return {n: self.schemas[n] for n in names if n in self.schemas}

    def checked_schemas(self, name: str) -> dict[str, StreamSchema]:
        """The typed streams whose values computation ``name``'s batches check: those it produces
        to, and those of its inputs an injector writes (a computation's productions were checked
        when they were made)."""
        spec = self.computation(name)
        return self.schemas_of([*spec.outputs, *(s for s in spec.inputs if s in self.injections)])

    def remove(self, name: str) -> ComputationSpec:
        """Remove a computation; refused while another computation consumes a stream only it produces."""
        spec = self.computation(name)
        remaining = {n: s for n, s in self.computations.items() if n != name}
        still = set(self.injections) | {o for s in remaining.values() for o in s.outputs}
        for other in remaining.values():
            orphaned = [s for s in other.inputs if s not in still]
            if orphaned:
                raise TopologyError(
                    f"Cannot remove {name!r}: computation {other.name!r} consumes {orphaned[0]!r}, which only it produces",
                    got=name,
                    hint=f"remove {other.name!r} first",
                )
        del self.computations[name]
        return spec

    # -- reading --------------------------------------------------------------------------------

    def streams(self) -> set[str]:
        return set(self.injections) | {o for spec in self.computations.values() for o in spec.outputs}

    def computation(self, name: str) -> ComputationSpec:
        try:
            return self.computations[name]
        except KeyError:
            raise TopologyError(
                f"Topology {self.name!r} has no computation {name!r}",
                got=name,
                hint=f"known computations are {sorted(self.computations)}",
            ) from None

    def producers(self, stream: str) -> list[str]:
        """Names of what writes ``stream``: computations, and ``inject:<stream>`` (or one
        ``inject:<stream>/<i>`` per part) for an injector."""
        names = [spec.name for spec in self.computations.values() if stream in spec.outputs]
        if stream in self.injections:
            names[:0] = self.injections[stream].producers
        return names

    def dedup_streams(self, name: str) -> frozenset[str]:
        """The input streams of computation ``name`` whose records are checked against ids seen:
        those injected with ``delivery="at_least_once"`` (other streams never repeat an id)."""
        spec = self.computation(name)
        return frozenset(s for s in spec.inputs
                         if s in self.injections and self.injections[s].options.delivery == "at_least_once")

    def _refuse_cycle(self, new: ComputationSpec) -> None:
        nodes = {**self.computations, new.name: new}
        stack, seen = [new.name], set()
        while stack:
            current = stack.pop()
            for out in nodes[current].outputs:
                for spec in nodes.values():
                    if out in spec.inputs:
                        if spec.name == new.name:
                            raise TopologyError(
                                f"Adding {new.name!r} would make a cycle through stream {out!r}",
                                got=list(new.outputs),
                                hint="low watermarks cannot advance around a cycle; send feedback through a new injected stream",
                            )
                        if spec.name not in seen:
                            seen.add(spec.name)
                            stack.append(spec.name)
