"""Stream schemas: what the values of a typed stream look like (no Spark needed).

A schema is declared with ``Topology.stream(name, schema=...)`` as a Spark DDL string
(``"user STRING, n BIGINT"``) or a ``pyarrow.Schema``. Every production to the stream is checked
against it where it is produced (a value that does not fit is the producing computation's error,
dead-lettered with the reason under ``on_error="dead_letter"``), and the stream's DataFrame view
(``headrace.stream_df``) shows its values as a typed ``value`` struct column.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable, Sequence

import pyarrow as pa

from .errors import OptionError, SchemaMismatchError

__all__ = ["StreamSchema", "ddl"]

_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(), "binary": pa.binary(), "boolean": pa.bool_(),
    "tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
}
_ALIASES = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint", "bool": "boolean",
            "real": "float"}
_NAMES = {t: n.upper() for n, t in _PRIMITIVES.items()}
_TOKEN = re.compile(r"\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*|[<>,:()]|\S)")


def ddl(schema: pa.Schema) -> str:
    """The Spark DDL string of an Arrow schema."""
    return ", ".join(f"`{f.name}` {_type_ddl(f.type)}" for f in schema)


def _type_ddl(t: pa.DataType) -> str:
    if t in _NAMES:
        return _NAMES[t]
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"ARRAY<{_type_ddl(t.value_type)}>"
    if pa.types.is_map(t):
        return f"MAP<{_type_ddl(t.key_type)}, {_type_ddl(t.item_type)}>"
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"`{f.name}`: {_type_ddl(f.type)}" for f in t) + ">"
    if pa.types.is_large_string(t):
        return "STRING"
    raise OptionError("A stream schema may use Spark SQL's types only", got=str(t),
                      hint=f"use one of {sorted(n.upper() for n in _PRIMITIVES)}, ARRAY, MAP or STRUCT")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = [m.group(1) for m in _TOKEN.finditer(text)]
        self.i = 0

    def fail(self, expected: str) -> OptionError:
        at = self.tokens[self.i] if self.i < len(self.tokens) else "the end"
        return OptionError(f"A stream schema must be a Spark DDL string; expected {expected} at {at!r}",
                           got=self.text, hint="e.g. schema='user STRING, n BIGINT, tags ARRAY<STRING>'")

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise self.fail(repr(expected) if expected else "more")
        self.i += 1
        return token

    def fields(self, end: str | None) -> list[pa.Field]:
        out = []
        while True:
            name = self.take().strip("`")
            if not re.match(r"^[^<>,:()]+$", name):
                raise self.fail("a field name")
            if self.peek() == ":":
                self.take()
            kind = self.type()
            nullable = True
            if (self.peek() or "").lower() == "not":
                self.take()
                if (self.peek() or "").lower() != "null":
                    raise self.fail("NOT NULL")
                self.take()
                nullable = False
            out.append(pa.field(name, kind, nullable=nullable))
            if self.peek() == ",":
                self.take()
                continue
            if self.peek() == end:
                return out
            raise self.fail("',' or " + (repr(end) if end else "the end"))

    def type(self) -> pa.DataType:
        word = self.take().lower()
        word = _ALIASES.get(word, word)
        if word in _PRIMITIVES:
            return _PRIMITIVES[word]
        if word == "array":
            self.take("<")
            item = self.type()
            self.take(">")
            return pa.list_(item)
        if word == "map":
            self.take("<")
            key = self.type()
            self.take(",")
            item = self.type()
            self.take(">")
            return pa.map_(key, item)
        if word == "struct":
            self.take("<")
            fields = self.fields(">")
            self.take(">")
            return pa.struct(fields)
        self.i -= 1
        raise self.fail(f"a type ({', '.join(sorted(_PRIMITIVES))}, array, map or struct)")


class StreamSchema:
    """A typed stream's value schema: ``.arrow`` (a pyarrow schema), ``.ddl`` (Spark DDL),
    ``check(value)`` (the reason a value does not fit, or ``None``)."""

    def __init__(self, schema: str | pa.Schema):
        if isinstance(schema, pa.Schema):
            self.arrow = schema
        elif isinstance(schema, str):
            parser = _Parser(schema)
            self.arrow = pa.schema(parser.fields(None))
        else:
            raise OptionError("A stream schema is a Spark DDL string or a pyarrow.Schema", got=schema,
                              hint="e.g. schema='user STRING, n BIGINT'")
        if len(self.arrow) == 0:
            raise OptionError("A stream schema needs at least one field", got=schema, hint="e.g. schema='n BIGINT'")
        self.ddl = ddl(self.arrow)
        # the schema exactly (the DDL drops NOT NULL, timestamp units...): what a segment's field columns name
        self.fingerprint = hashlib.sha256(self.arrow.serialize().to_pybytes()).hexdigest()
        self.struct = pa.struct(list(self.arrow))
        self.struct_ddl = _type_ddl(self.struct)
        self._names = set(self.arrow.names)
        self._required = [f.name for f in self.arrow if not f.nullable]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StreamSchema) and self.arrow.equals(other.arrow)

    def __repr__(self) -> str:
        return f"StreamSchema({self.ddl!r})"

    def check(self, value: Any) -> str | None:
        """Why ``value`` does not fit (``None`` when it does)."""
        if not isinstance(value, dict):
            return f"a value of a typed stream is a dict of its fields, not {type(value).__name__}"
        extra = sorted(map(str, value.keys() - self._names))
        if extra:
            return f"field {extra[0]!r} is not in the schema ({self.ddl})"
        missing = [n for n in self._required if value.get(n) is None]
        if missing:
            return f"field {missing[0]!r} is NOT NULL but missing"
        try:
            pa.array([value], type=self.struct)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            return f"{type(exc).__name__}: {exc} (schema {self.ddl})"
        return None

    def misfits(self, values: Sequence[Any]) -> list[int]:
        """The positions of the ``values`` that do not fit: one conversion of the whole column
        when they all do, ``check`` one by one otherwise."""
        if self.column(values) is not None:
            return []
        return [i for i, v in enumerate(values) if self.check(v) is not None]

    def column(self, values: Sequence[Any]) -> pa.StructArray | None:
        """The values as one typed struct column when every one fits (one conversion); else None."""
        names, required = self._names, self._required
        if all(isinstance(v, dict) and v.keys() <= names and all(v.get(n) is not None for n in required)
               for v in values):
            try:
                return pa.array(list(values), type=self.struct)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                pass
        return None

    def require(self, stream: str, value: Any) -> None:
        reason = self.check(value)
        if reason is not None:
            raise SchemaMismatchError(f"A value produced to typed stream {stream!r} does not fit its schema: {reason}",
                                      got=value, hint=f"produce a dict with the fields {self.ddl}")

    def values(self, values: Iterable[Any]) -> pa.Array:
        """The values as one typed struct column (a value that does not fit becomes null)."""
        listed = list(values)
        try:
            return pa.array(listed, type=self.struct)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return pa.array([v if self.check(v) is None else None for v in listed], type=self.struct)
