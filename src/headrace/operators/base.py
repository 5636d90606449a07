"""What the operators share: the window type, checks of their class settings (errors that teach),
one pending timer per key, and the policy for records too late to use."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple, TypeVar

from ..errors import OptionError
from ..model import Computation, Context, Record

T = TypeVar("T")

__all__ = ["Window", "Operator", "TIMER", "held", "record_of"]

TIMER = "operator"  # the one watermark timer an operator keeps per key: its next due time


class Window(NamedTuple):
    """A window of event time, ``start`` inclusive, ``end`` exclusive (milliseconds)."""

    start: int
    end: int


class Operator(Computation):
    """Base of the operators: a ``Computation`` whose settings are class attributes, checked when
    it is added to a topology (or opened in a ``Harness``), with the options it needs set there."""

    kind = "Operator"

    @classmethod
    def check(cls, name: str) -> None:
        """Refuse settings that cannot work, naming them (``OptionError``)."""

    @classmethod
    def needs_late_records(cls) -> bool:
        """Whether the operator itself must see records behind the watermark (``late="deliver"``)."""
        return False

    @classmethod
    def resolve_options(cls, name: str, options: dict[str, Any]) -> dict[str, Any]:
        cls.check(name)
        if cls.needs_late_records():
            if options.get("late", "deliver") != "deliver":
                raise OptionError(f"{cls.kind} {name!r} handles late records itself (allowed_lateness_ms or "
                                  "late_stream is set), so it needs late='deliver'", got=options["late"],
                                  hint="leave the late option out (the operator sets it), or set "
                                       "allowed_lateness_ms = 0 and late_stream = None to let the engine drop them")
            options = {**options, "late": "deliver"}
        return options

    @classmethod
    def setting(cls, name: str, attribute: str, *, lowest: int = 1, optional: bool = False,
                example: str = "10_000") -> int | None:
        """Class attribute ``attribute``: an int of milliseconds >= ``lowest`` (or None if optional)."""
        value = getattr(cls, attribute, None)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise OptionError(f"{cls.kind} {name!r} needs {attribute}, in milliseconds, an int >= {lowest}",
                              got=value, hint=f"set it in the class: {attribute} = {example}")
        return value

    @classmethod
    def stream_setting(cls, name: str, attribute: str, example: str) -> str:
        value = getattr(cls, attribute, None)
        if not isinstance(value, str) or not value:
            raise OptionError(f"{cls.kind} {name!r} needs {attribute}, the name of one of its input streams",
                              got=value, hint=f"set it in the class: {attribute} = {example!r}")
        return value

    @classmethod
    def two_streams(cls, name: str, first: str, second: str, examples: tuple[str, str], hint: str) -> None:
        """Class attributes ``first`` and ``second`` name two different input streams."""
        a = cls.stream_setting(name, first, examples[0])
        b = cls.stream_setting(name, second, examples[1])
        if a == b:
            what = "joins two different streams" if first == "left" else "looks a stream up in another one"
            raise OptionError(f"{cls.kind} {name!r} {what}",
                              got=(a, b), hint=hint)

    @classmethod
    def require_hook(cls, name: str, hook: str, base: type, hint: str) -> None:
        if getattr(cls, hook) is getattr(base, hook):
            raise OptionError(f"{cls.kind} {name!r} does not define {hook}", got=cls, hint=hint)

    def side_of(self, ctx: Context, record: Record, sides: Mapping[str, T]) -> T:
        """Which of the operator's inputs the record came from, by its stream."""
        side = sides.get(record.stream)
        if side is None:
            raise OptionError(f"{self.kind} {type(self).__name__!r} got a record of stream {record.stream!r}, "
                              f"which is none of its inputs {sorted(sides)}", got=record.value,
                              hint="subscribe it to exactly the streams its class names, e.g. "
                                   f"inputs={{{', '.join(repr(s) + ': key_by(...)' for s in sorted(sides))}}}")
        return side

    @staticmethod
    def wake_by(ctx: Context, state: dict[str, Any], due: int) -> None:
        """Make sure the key's timer fires by ``due``: what a new record needs, in O(1) (the
        timer's own run then does the work for everything held, once per batch)."""
        if state.get("t") is None or due < state["t"]:
            ctx.set_timer(TIMER, due)
            state["t"] = due

    @staticmethod
    def schedule(ctx: Context, state: dict[str, Any], due: Iterable[int]) -> None:
        """Keep the key's one timer at its earliest due time (rewritten only when that moves);
        no due time left deletes it."""
        first = min(due, default=None)
        if first != state.get("t"):
            if first is None:
                ctx.delete_timer(TIMER)
                state.pop("t", None)
            else:
                ctx.set_timer(TIMER, first)
                state["t"] = first


def held(record: Record) -> tuple[int, str, Any]:
    """A record as operators keep it in state: (timestamp, id, value)."""
    return (record.timestamp, record.id, record.value)


def record_of(key: str, stream: str, kept: tuple[int, str, Any]) -> Record:
    timestamp, id_, value = kept
    return Record(key, value, timestamp, id_, stream)
