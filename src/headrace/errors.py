"""Errors that teach: each one says what went wrong, what was received, and how to fix it."""

from __future__ import annotations

__all__ = [
    "HeadraceError",
    "TopologyError",
    "OptionError",
    "InvalidKeyError",
    "UnknownStreamError",
    "UserCodeError",
    "BadInputError",
    "FencedWriterError",
    "StaleBatchError",
    "StoreError",
    "SchemaMismatchError",
    "MISSING_MODULE_HINT",
]

# The hint for a value that a worker cannot unpickle because its class's module is not there.
MISSING_MODULE_HINT = ("its class comes from a module the workers cannot import: ship it with run(py_files=[...]) "
                       "or headrace run --py-files, or install it on the workers")


def _clip(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class HeadraceError(Exception):
    """Base of every error headrace raises on purpose.

    The message always reads ``<what> (got <received>). Hint: <how to fix it>``.
    """

    def __init__(self, what: str, got: object = None, hint: str = "", *, got_text: str | None = None):
        self.what = what
        self.got = got
        self.hint = hint
        parts = [what]
        shown = got_text if got_text is not None else (None if got is None else _clip(got))
        if shown is not None:
            parts.append(f" (got {shown})")
        if hint:
            parts.append(f". Hint: {hint}")
        super().__init__("".join(parts))


class TopologyError(HeadraceError):
    """The topology is not well formed; raised while it is being built."""


class OptionError(HeadraceError, ValueError):
    """A computation, injector or runner option has a bad name or value."""


class InvalidKeyError(HeadraceError, TypeError):
    """A key extractor returned something that is not a ``str``."""


class UnknownStreamError(HeadraceError, KeyError):
    """User code produced to a stream the computation did not declare."""

    def __str__(self) -> str:  # KeyError would otherwise quote the whole message
        return Exception.__str__(self)


class UserCodeError(HeadraceError):
    """User code raised; names the computation, key and record (or timer) that triggered it."""


class BadInputError(HeadraceError):
    """A record that cannot be decoded or keyed; names the computation, stream and record."""


class StoreError(HeadraceError):
    """The backing store refused or failed an operation."""


class FencedWriterError(StoreError):
    """A writer whose sequencer was superseded tried to commit (a zombie)."""


class StaleBatchError(StoreError):
    """A batch was committed for a shard that has already moved past it."""


class SchemaMismatchError(HeadraceError, TypeError):
    """A value produced to a typed stream does not fit the stream's schema."""
