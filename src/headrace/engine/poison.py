"""What the store can hold, checked where user code hands it over (``ctx.produce``, ``ctx.set_timer``,
an input record's key) rather than at commit, where a value that cannot be written fails the whole
batch with no computation, key or record named, on every replay. A check raises the error that the
invocation's ``on_error`` policy then dead-letters or fails with, naming all three."""

from __future__ import annotations

import pickle
from typing import Any

from ..errors import InvalidKeyError, OptionError

__all__ = ["MIN_I64", "MAX_I64", "storable_text", "shown_text", "check_text", "check_millis", "encode_value",
           "picklable"]

MIN_I64, MAX_I64 = -(2 ** 63), 2 ** 63 - 1  # a timestamp's column in the store and in Arrow


def storable_text(text: str) -> bool:
    """True if ``text`` can be written as UTF-8 (a lone surrogate, e.g. from a JSON ``"\\udc80"``
    escape, cannot)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def shown_text(text: str) -> str:
    """``text`` with whatever UTF-8 cannot hold escaped (``\\udc80``): a key hint the store can write."""
    return text if storable_text(text) else text.encode("utf-8", "backslashreplace").decode()


def check_text(key: Any, what: str) -> None:
    """A key, key hint, tag or name must be a str the store can write."""
    if type(key) is not str:
        raise InvalidKeyError(f"A {what} must be a str", got_text=f"{key!r} of type {type(key).__name__}",
                              hint="convert it, e.g. key=str(user_id)")
    if not storable_text(key):
        raise InvalidKeyError(f"A {what} must be text UTF-8 can hold", got_text=f"{key!r} (a lone surrogate)",
                              hint="clean it first, e.g. key.encode('utf-8', 'replace').decode()")


def check_millis(value: int, what: str) -> int:
    """An integer timestamp must fit the store's 64-bit column."""
    if not MIN_I64 <= value <= MAX_I64:
        raise OptionError(f"A {what} must fit in 64 bits", got=value,
                          hint="timestamps are integer milliseconds since the Unix epoch: were these "
                               "nanoseconds, or a computed value gone wrong?")
    return value


def encode_value(value: Any, what: str) -> bytes:
    """A value as the bus stores it (pickled once, here; the segment writer reuses the bytes)."""
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise OptionError(f"A {what} cannot be pickled for the bus",
                          got_text=f"{type(value).__name__} value: {type(exc).__name__}: {exc}",
                          hint="produce plain data (dicts, lists, numbers, strings) or objects pickle can "
                               "serialize (no open files, locks, lambdas or generators)") from None


def picklable(value: Any) -> Any:
    """``value`` if the bus can store it, else its repr (a dead letter must always be writable)."""
    try:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            shown = shown_text(repr(value))[:2000]
        except Exception:
            shown = "its repr raised"
        return f"<unpicklable {type(value).__name__}: {shown}>"
    return value
