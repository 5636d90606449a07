"""What a failure of user code becomes: a dead-letter record's value, or the error that fails
the batch, naming the computation, the key and what it was running."""

from __future__ import annotations

from typing import Any

from ..errors import HeadraceError, UserCodeError

__all__ = ["dead_letter_value", "user_error"]


def dead_letter_value(name: str, key: str, what: str, exc: Exception, stream: str | None, value: Any,
                 record_id: str | None) -> dict[str, Any]:
    return {"computation": name, "key": key, "at": what, "stream": stream, "record_id": record_id,
            "value": value, "error": f"{type(exc).__name__}: {exc}"}


def user_error(name: str, key: str, what: str, exc: Exception) -> UserCodeError:
    retried = "the batch was not committed and will be retried from its committed point"
    if isinstance(exc, UserCodeError):
        return exc  # already names the computation and key
    if isinstance(exc, HeadraceError):  # a misuse of ctx: its own what, got and hint, once each
        return UserCodeError(f"Computation {name!r} failed on key {key!r} at {what}: {exc.what}", got=exc.got,
                             hint=f"{exc.hint}; {retried}" if exc.hint else f"fix the computation; {retried}")
    return UserCodeError(
        f"Computation {name!r} failed on key {key!r} at {what}",
        got_text=f"{type(exc).__name__}: {exc}",
        hint=f"fix the computation and run again; {retried}",
    )
