"""Ready-made hooks for a ``MonoidComputation`` that headrace can run on whole columns.

    from headrace import MonoidComputation
    from headrace.monoids import add, field, tumbling

    class WindowSum(MonoidComputation):
        lift = field("n")          # a record's part of the aggregate: its value's field "n"
        window = tumbling(10_000)  # 10-second windows, each emitted at its end
        combine = add              # a + b

        def zero(self):
            return 0

        def emit(self, ctx, timer, aggregate):
            ctx.produce("sums", {"key": ctx.key, "end": timer.timestamp, "sum": aggregate})

Each is a callable of the record and behaves exactly like the method it stands in for. A monoid
whose ``lift`` is ``field(name)`` or ``constant(n)``, whose ``window`` is ``tumbling(size)`` or the
default, and whose ``combine`` is ``add`` (or ``operator.add``), reading a typed stream
(``Topology.stream(name, schema=...)``) keyed with ``key_by("field")``, is folded from the
stream's field columns: no value unpickled and no call per record (docs/architecture.md §3.13).
Everything else is folded one record at a time, with the same result.
"""

from __future__ import annotations

from typing import Any

from .errors import BadInputError, OptionError
from .model import Record

__all__ = ["add", "field", "constant", "tumbling", "Add", "Field", "Constant", "Tumbling"]


class Field:
    """``lift = field("n")``: a record's part is its value's field ``n``."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise OptionError("field(name) takes the name of a field of the records' values", got=name,
                              hint='e.g. lift = field("n")')
        self.name = name

    def __call__(self, record: Record) -> Any:
        try:
            return record.value[self.name]
        except (KeyError, TypeError, IndexError):
            raise BadInputError(f"field({self.name!r}) found no field {self.name!r} in the record's value",
                                got=record.value, hint="check the field name, or write lift(self, record) yourself"
                                ) from None

    def __repr__(self) -> str:
        return f"field({self.name!r})"


class Constant:
    """``lift = constant(1)``: every record's part is the same value (a count, with ``add``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __call__(self, record: Record) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"constant({self.value!r})"


class Tumbling:
    """``window = tumbling(size)``: back-to-back windows of ``size`` ms; a record at ``ts`` is in
    the one ending (exclusive) at ``ts - ts % size + size``, emitted once the watermark reaches it."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        if type(size) is not int or size <= 0:
            raise OptionError("tumbling(size) takes a window length in milliseconds, a positive int", got=size,
                              hint="e.g. window = tumbling(60_000) for one-minute windows")
        self.size = size

    def __call__(self, record: Record) -> int:
        ts = record.timestamp
        return ts - ts % self.size + self.size

    def __repr__(self) -> str:
        return f"tumbling({self.size})"


class Add:
    """``combine = add``: ``a + b``, like ``operator.add``, which a type checker takes for a
    method of one argument when it is assigned in a class body (it binds it to ``self``); an
    instance of this class it takes for the hook it stands in for."""

    __slots__ = ()

    def __call__(self, a: Any, b: Any) -> Any:
        return a + b

    def __repr__(self) -> str:
        return "add"


add = Add()


def field(name: str) -> Field:
    """``lift = field(name)``: a record's part is its value's field ``name``."""
    return Field(name)


def constant(value: Any) -> Constant:
    """``lift = constant(value)``: every record's part is ``value`` (``constant(1)``: a count)."""
    return Constant(value)


def tumbling(size: int) -> Tumbling:
    """``window = tumbling(size)``: back-to-back windows of ``size`` ms, each emitted at its end."""
    return Tumbling(size)
