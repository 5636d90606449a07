"""How a consumer keys a stream: ``key_by`` a field or a function, as a ``KeyExtractor``."""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from .errors import InvalidKeyError

__all__ = ["KeyExtractor", "key_by"]


class KeyExtractor:
    """Turns a record's value into the consumer's key (always a ``str``)."""

    __slots__ = ("description", "_fn", "field", "kind")

    def __init__(self, fn: Callable[[Any], Any], description: str, field: str | None = None, kind: type = str):
        self._fn = fn
        self.description = description
        self.field = field  # key_by("field"): the field it reads (``many`` reads it directly); None for a function
        self.kind = kind  # what the field holds: a str (the key), or an int (the key is its decimal text)

    def __call__(self, value: Any) -> str:
        key = self._fn(value)
        if type(key) is not str:
            raise InvalidKeyError(
                f"Key extractor {self.description} must return a str",
                got_text=f"{key!r} of type {type(key).__name__}",
                hint="convert it in the extractor, e.g. key_by(lambda v: str(v['user_id']))",
            )
        if not key.isascii():
            try:
                key.encode()
            except UnicodeEncodeError:  # a lone surrogate (a JSON "\udc80" escape): no store can hold it
                raise InvalidKeyError(f"Key extractor {self.description} returned text UTF-8 cannot hold",
                                      got_text=f"{key!r} (a lone surrogate)",
                                      hint="clean it in the extractor, e.g. "
                                           "key_by(lambda v: v['user'].encode('utf-8', 'replace').decode())") from None
        return key

    def many(self, values: list[Any]) -> list[str] | None:
        """The keys of many values at once; None if any has no key (call it one value at a time
        to learn which and why)."""
        str_, name = str, self.field
        try:
            keys = [v[name] for v in values] if name is not None else list(map(self._fn, values))
        except Exception:
            return None
        if self.kind is int:  # an int field's decimal text (a bool, or any other, has none)
            return list(map(str_, keys)) if all(type(k) is int for k in keys) else None
        if not all(type(k) is str_ for k in keys):
            return None
        joined = "".join(keys)
        return keys if joined.isascii() or joined.encode("utf-8", "replace") == joined.encode("utf-8", "surrogatepass") else None

    @property
    def fingerprint(self) -> str:
        """What the extractor does, as a short text two processes agree on: its field, or its
        function's name and code (a routed segment keyed with another extractor is keyed again)."""
        if self.field is not None:
            return f"field:{self.field}" if self.kind is str else f"field:{self.field}:{self.kind.__name__}"
        code = getattr(self._fn, "__code__", None)
        text = (self.description if code is None else
                f"{self.description}:{code.co_code.hex()}:{code.co_consts!r}:{code.co_names!r}")
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return self.description


def key_by(field_or_callable: str | Callable[[Any], Any], kind: type = str) -> KeyExtractor:
    """``key_by("query")`` keys by ``value["query"]``; ``key_by("user_id", int)`` by the decimal
    text of an int field, ``str(value["user_id"])``; ``key_by(fn)`` keys by ``fn(value)``. A field
    is read from a typed stream's field columns without unpickling the values."""
    if isinstance(field_or_callable, str):
        field = field_or_callable
        if kind is not str and kind is not int:
            from .errors import TopologyError

            raise TopologyError(f"key_by({field!r}, kind) takes a field that holds a str or an int",
                                got_text=repr(kind), hint=f"write key_by({field!r}) or key_by({field!r}, int)")
        described = f"key_by({field!r})" if kind is str else f"key_by({field!r}, int)"

        def by_field(value: Any) -> Any:
            try:
                key = value[field]
            except (KeyError, TypeError, IndexError):
                raise InvalidKeyError(
                    f"{described} found no field {field!r} in the record",
                    got=value,
                    hint="check the field name, or pass a function: key_by(lambda v: ...)",
                ) from None
            if kind is str or type(key) is int:
                return key if kind is str else str(key)
            raise InvalidKeyError(f"{described} found no int in field {field!r}",
                                  got_text=f"{key!r} of type {type(key).__name__}",
                                  hint=f"key_by({field!r}) keys by a str field; convert others in a function, "
                                       f"e.g. key_by(lambda v: str(v[{field!r}]))")

        return KeyExtractor(by_field, described, field, kind)
    if callable(field_or_callable):
        name = getattr(field_or_callable, "__qualname__", repr(field_or_callable))
        return KeyExtractor(field_or_callable, f"key_by({name})")
    from .errors import TopologyError  # type: ignore[unreachable]  # a user's argument need not match the hints

    raise TopologyError(
        "key_by takes a field name or a callable",
        got_text=f"{field_or_callable!r} of type {type(field_or_callable).__name__}",
        hint="write key_by('field') or key_by(lambda value: value['field'])",
    )
