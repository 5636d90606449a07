"""The user model: what a computation receives, what it writes, and how it is configured.

Nothing here knows about Spark or the store; the engine injects a context per key.
"""

from __future__ import annotations


import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, NamedTuple, Protocol, Union

from .codecs import Codec, codec_named
from .errors import OptionError
from .keys import KeyExtractor, key_by

__all__ = [
    "Computation",
    "MonoidComputation",
    "Context",
    "Record",
    "Timer",
    "KeyExtractor",
    "key_by",
    "ComputationOptions",
    "to_millis",
    "BEGINNING_OF_TIME",
    "END_OF_TIME",
]

BEGINNING_OF_TIME = -(2**63)
END_OF_TIME = 2**63 - 1

Domain = Literal["watermark", "wall"]
DOMAINS: tuple[str, ...] = ("watermark", "wall")
Timestamp = Union[int, _dt.datetime]


class Record(NamedTuple):
    """One record as a computation receives it; ``id`` is unique, assigned at production;
    ``stream`` is the input stream it came from (a computation of several inputs tells them apart
    by it in ``process_record``; empty elsewhere: in a monoid's ``lift`` and ``window``, which fold
    every input alike, and for a record read back with ``headrace.read``)."""

    key: str
    value: Any
    timestamp: int
    id: str
    stream: str = ""


class Timer(NamedTuple):
    """A timer as ``process_timer`` receives it."""

    tag: str
    timestamp: int
    domain: str = "watermark"


def to_millis(value: Timestamp, what: str = "timestamp") -> int:
    """Integer milliseconds since the epoch; accepts ``int`` or an aware/naive-UTC ``datetime``."""
    if isinstance(value, bool) or not isinstance(value, (int, _dt.datetime)):
        raise OptionError(
            f"A {what} must be integer milliseconds since the Unix epoch or a datetime",
            got_text=f"{value!r} of type {type(value).__name__}",
            hint="pass e.g. 1700000000000, or datetime(2023, 11, 14, tzinfo=timezone.utc)",
        )
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return int(value.timestamp() * 1000)
    return value


class Context(Protocol):
    """What user code sees during one invocation; the engine passes it explicitly as ``ctx``."""

    @property
    def key(self) -> str: ...

    @property
    def low_watermark(self) -> int: ...

    state: Any

    def set_timer(self, tag: str, timestamp: Timestamp, domain: str = "watermark") -> None: ...

    def delete_timer(self, tag: str) -> None: ...

    def produce(self, stream: str, value: Any, timestamp: Timestamp | None = None, key: str | None = None) -> None: ...

    def count(self, counter: str, n: int = 1) -> None: ...


class Computation:
    """Subclass and override ``process_record`` and/or ``process_timer``.

    One instance serves many keys: keep per-key data in ``ctx.state``, never on ``self``.
    """

    def process_record(self, ctx: Context, record: Record) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def process_timer(self, ctx: Context, timer: Timer) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def overrides(cls, hook: str) -> bool:
        return getattr(cls, hook) is not getattr(Computation, hook)

    @classmethod
    def resolve_options(cls, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """The options computation ``name`` runs with, given those passed to ``Topology.add`` (or
        ``Harness``): a class that needs an option set a certain way (an operator that handles
        late records itself needs ``late="deliver"``) sets its default here, and refuses a
        contradiction with an ``OptionError``. By default, the options as given."""
        return options


class MonoidComputation(Computation):
    """A computation whose per-key state is a commutative monoid, one aggregate per key and window
    (docs/architecture.md §3.13). Override ``zero``, ``lift``, ``combine`` and ``emit``; ``window``
    is optional. headrace then folds records into partial aggregates where it reads them, before
    they reach their key's shard, and merges each partial into the store without reading the
    key's old value first.

    - ``zero()``: the identity: ``combine(zero(), a) == a``.
    - ``lift(record)``: one record as an aggregate.
    - ``combine(a, b)``: associative and commutative, since partials folded by different read
      tasks meet in any order. Return a new value, or ``a`` changed in place; never change ``b``.
    - ``window(record)``: the event time at which the aggregate holding this record is complete
      (default: the end of time, one aggregate per key, emitted once the input has ended). A
      watermark timer at that time fires ``emit`` once the low watermark reaches it.
    - ``emit(ctx, timer, aggregate)``: what to produce for the key's complete window
      ``timer.timestamp``, with ``ctx.produce``; the window's aggregate is then forgotten.

    It defines no ``process_record`` or ``process_timer`` and keeps no ``ctx.state`` of its own.
    """

    def zero(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def lift(self, record: Record) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def combine(self, a: Any, b: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def window(self, record: Record) -> int:
        return END_OF_TIME

    def emit(self, ctx: Context, timer: Timer, aggregate: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def resolve_options(cls, name: str, options: dict[str, Any]) -> dict[str, Any]:
        if options.get("state_ttl_ms") is not None:
            raise OptionError(f"Monoid computation {name!r} cannot take state_ttl_ms", got=options["state_ttl_ms"],
                              hint="a monoid's aggregates go when their window is emitted: give it a window(), or "
                                   "write it as a Computation to give its state a time to live")
        return super().resolve_options(name, options)

    @classmethod
    def missing_hooks(cls) -> list[str]:
        return [h for h in MONOID_HOOKS if getattr(cls, h) is getattr(MonoidComputation, h)]


MONOID_HOOKS = ("zero", "lift", "combine", "emit")


_CHOICES: dict[str, tuple[str, ...]] = {
    "late": ("drop", "deliver"),
    "productions": ("strong", "weak"),
    "semantics": ("exactly_once", "at_least_once"),
    "on_error": ("fail", "dead_letter"),
    "state_semantics": ("exactly_once", "at_least_once", "at_most_once"),
    "output_semantics": ("exactly_once", "at_least_once", "at_most_once"),
    "state_ttl_domain": ("watermark", "wall"),
}

# The Facebook paper's Figure 8: the (state, output) semantics that can be had together, and why
# the others cannot.
SEMANTICS = {
    ("exactly_once", "exactly_once"), ("exactly_once", "at_least_once"), ("exactly_once", "at_most_once"),
    ("at_least_once", "at_least_once"), ("at_most_once", "at_most_once"),
}
_IMPOSSIBLE = {
    "at_least_once": "at-least-once state re-runs user code on a retry, so the output of the retried input "
                     "goes out again: its output can only be at_least_once",
    "at_most_once": "at-most-once state saves the input offset before the state, so a crash loses the input's "
                    "output along with its effect on the state: its output can only be at_most_once",
}


@dataclass(frozen=True)
class ComputationOptions:
    """Per-computation options, given as keyword arguments to ``Topology.add`` or ``Harness``.

    - ``codec``: state codec, ``"pickle"`` (default), ``"json"``, ``"msgpack"``, ``"bytes"``.
    - ``late``: records behind the low watermark are ``"drop"``-ped (counted) or ``"deliver"``-ed (counted).
    - ``productions``: ``"strong"`` (checkpointed with the state) or ``"weak"`` (written first, faster, may repeat).
    - ``state_semantics`` and ``output_semantics``: each ``"exactly_once"`` (default),
      ``"at_least_once"`` or ``"at_most_once"``, in the combinations of the Facebook paper's Figure 8
      (``SEMANTICS``). State: does an input count at least, at most or exactly once in the state?
      Output: may a production go out twice, be lost, or neither? At-least-once state commits the
      state, then the offset (a retry re-runs user code); at-most-once state commits the offset
      first (a crash loses the batch). At-least-once output sends productions before the state
      commit (``productions="weak"``); at-most-once output sends them after it.
    - ``semantics``: ``"exactly_once"`` or ``"at_least_once"``, the older name of ``state_semantics``
      (at-least-once state brings at-least-once output). ``productions``: ``"strong"`` or ``"weak"``,
      the older name of ``output_semantics`` exactly-once or at-least-once.
    - ``dedup``: discard records whose id was already seen (default on with exactly-once).
    - ``dedup_slack_ms``: how far behind the low watermark seen ids are kept before garbage collection.
    - ``shards``: number of key shards (MillWheel's key intervals).
    - ``on_error``: user code that raises fails the batch (``"fail"``), or its record (or timer) goes,
      with the error, to the stream ``<name>.dead_letter`` and everything that invocation did is undone.
    - ``watermark_percentile``: ``{stream: p}``, per subscription: below 100, the input low
      watermark from that stream ignores its slowest ``100 - p`` % of producers (MillWheel's
      percentile watermark); their records behind it are late. Default 100 (the true low watermark).
    - ``alert_lag_ms``: while the topology runs, raise a lag alert when the computation's output low
      watermark falls more than this far behind the wall clock, and clear it once it catches up
      (docs/monitoring.md). Default ``None``: no alert.
    - ``state_ttl_ms`` and ``state_ttl_domain``: a key's state expires this long after its last
      change, in event time (``"watermark"``, the default: after the timestamp of the record or
      timer that changed it) or wall-clock time (``"wall"``); a framework-owned timer clears it,
      exactly once, and a record that comes after the expiry sees no state. ``ctx.state_expires_at``
      says when, so user code can set a timer of its own before. Default ``None``: state lives
      until user code clears it. Not for monoid computations (their windows end their aggregates).
    - ``process_timeout_s``: a watchdog (``engine/watchdog.py``): an invocation of ``process_record``
      or ``process_timer`` running longer than this many seconds fails under ``on_error``. Default None.
    """

    codec: Codec = codec_named("pickle")
    late: str = "drop"
    productions: str = "strong"
    semantics: str = "exactly_once"
    dedup: bool = True
    dedup_slack_ms: int = 3_600_000
    shards: int = 4
    on_error: str = "fail"
    watermark_percentile: Mapping[str, float] = field(default_factory=dict)
    state_semantics: str = "exactly_once"
    output_semantics: str = "exactly_once"
    alert_lag_ms: int | None = None
    state_ttl_ms: int | None = None
    state_ttl_domain: str = "watermark"
    process_timeout_s: float | None = None

    def percentile(self, stream: str) -> float:
        return float(self.watermark_percentile.get(stream, 100.0))

    @classmethod
    def from_kwargs(cls, owner: str, options: dict[str, Any]) -> "ComputationOptions":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionError(
                f"Computation {owner!r} got unknown option {unknown[0]!r}",
                got=options[unknown[0]],
                hint=f"valid options are {sorted(known)}",
            )
        values = dict(options)
        if "codec" in values:
            values["codec"] = codec_named(values["codec"])
        for name, allowed in _CHOICES.items():
            if name in values and values[name] not in allowed:
                raise OptionError(
                    f"Computation {owner!r} option {name!r} must be one of {list(allowed)}",
                    got=values[name],
                    hint=f"write {name}={allowed[0]!r}",
                )
        ttl = values.get("state_ttl_ms")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1):
            raise OptionError(
                f"Computation {owner!r} option 'state_ttl_ms' must be a positive number of milliseconds or None",
                got=ttl,
                hint="e.g. state_ttl_ms=3_600_000 (state expires an hour after its last change); None keeps it "
                     "until user code clears it",
            )
        limit = values.get("process_timeout_s")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0):
            raise OptionError(f"Computation {owner!r} option 'process_timeout_s' must be a number of seconds > 0 or None",
                              got=limit, hint="e.g. process_timeout_s=30; leave it out for no watchdog")
        for name in ("shards", "dedup_slack_ms"):
            if name in values:
                v = values[name]
                lowest = 1 if name == "shards" else 0
                if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
                    raise OptionError(
                        f"Computation {owner!r} option {name!r} must be an integer >= {lowest}",
                        got=v,
                        hint=f"e.g. {name}={cls.__dataclass_fields__[name].default}",
                    )
        percentiles = values.get("watermark_percentile", {})
        if not isinstance(percentiles, Mapping) or not all(
                isinstance(p, (int, float)) and not isinstance(p, bool) and 0 < p <= 100 for p in percentiles.values()):
            raise OptionError(f"Computation {owner!r} option 'watermark_percentile' maps input streams to a "
                              "percentile in (0, 100]", got=percentiles, hint="e.g. watermark_percentile={'clicks': 99}")
        lag = values.get("alert_lag_ms")
        if lag is not None and (isinstance(lag, bool) or not isinstance(lag, int) or lag < 1):
            raise OptionError(f"Computation {owner!r} option 'alert_lag_ms' must be an integer >= 1 (milliseconds)",
                              got=lag, hint="e.g. alert_lag_ms=30000 alerts when the watermark is 30 s behind the "
                                            "wall clock; leave it out for no alert")
        if "dedup" in values and not isinstance(values["dedup"], bool):
            raise OptionError(f"Computation {owner!r} option 'dedup' must be True or False", got=values["dedup"])
        _resolve_semantics(owner, values)
        if values["state_semantics"] != "exactly_once" and "dedup" not in values:
            values["dedup"] = False  # at-least-once lets repeats in; at-most-once never reads an input twice
        return cls(**values)

    @property
    def exactly_once(self) -> bool:
        """Exactly-once state: each input counts once (dedup ids and the version check)."""
        return self.state_semantics == "exactly_once"

    @property
    def conditional_commits(self) -> bool:
        """A shard's commit is conditional on its version: a batch commits once (exactly-once
        state) or its offset is saved first and its state at most once (at-most-once state)."""
        return self.state_semantics != "at_least_once"


def _resolve_semantics(owner: str, values: dict[str, Any]) -> None:
    """Fill ``state_semantics``/``output_semantics`` and the older ``semantics``/``productions``
    from whichever were given, refusing a contradiction or a combination Figure 8 rules out."""
    implied_state = {"exactly_once": "exactly_once", "at_least_once": "at_least_once"}.get(values.get("semantics", ""))
    state = values.get("state_semantics", implied_state or "exactly_once")
    if implied_state is not None and implied_state != state:
        raise OptionError(f"Computation {owner!r} got semantics={values['semantics']!r} and "
                          f"state_semantics={state!r}", got=values["semantics"],
                          hint="give state_semantics alone (semantics is its older name)")
    implied_output = {"strong": "exactly_once", "weak": "at_least_once"}.get(values.get("productions", ""))
    if state == "at_least_once" and implied_output == "exactly_once" and "output_semantics" not in values:
        implied_output = None  # strong productions under at-least-once state: a retry still repeats them
    default_output = {"exactly_once": "exactly_once"}.get(state, state)
    output = values.get("output_semantics", implied_output or default_output)
    if implied_output is not None and implied_output != output:
        raise OptionError(f"Computation {owner!r} got productions={values['productions']!r} and "
                          f"output_semantics={output!r}", got=values["productions"],
                          hint="give output_semantics alone (productions is its older name)")
    if (state, output) not in SEMANTICS:
        raise OptionError(f"Computation {owner!r} cannot have {state} state with {output} output: {_IMPOSSIBLE[state]}",
                          got=(state, output), hint=f"state_semantics={state!r}, output_semantics={state!r}, or "
                                                    "exactly_once state with any output semantics")
    values["state_semantics"], values["output_semantics"] = state, output
    values["semantics"] = state
    values["productions"] = {"exactly_once": "strong", "at_least_once": "weak", "at_most_once": "after_state"}[output]


def check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise OptionError(
            "A timer domain must be 'watermark' or 'wall'",
            got=domain,
            hint="use domain='watermark' (event time, fires on the low watermark) or domain='wall'",
        )
    return domain

