"""What a failure of user code becomes: a dead-letter record's value, or the error that fails
the batch, naming the computation, the key and what it was running."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import BadInputError, HeadraceError, UserCodeError


from .batch import InputRecord
from .poison import MAX_I64, MIN_I64, picklable, shown_text, storable_text

__all__ = ["dead_letter_value", "user_error", "construct", "poison_input", "invoke_on_timer", "TIMER_REFIRE_LIMIT"]

# Timers one key may fire in one batch at or before a time it already fired at: past this, a
# handler that re-arms its timer at or below the watermark would loop forever inside the batch.
TIMER_REFIRE_LIMIT = 10_000


class TimerLoopError(HeadraceError):
    """A key re-fired timers past ``TIMER_REFIRE_LIMIT`` in one batch."""


def dead_letter_value(name: str, key: str, what: str, exc: Exception, stream: str | None, value: Any,
                 record_id: str | None) -> dict[str, Any]:
    return {"computation": name, "key": key, "at": what, "stream": stream, "record_id": record_id,
            "value": picklable(value), "error": f"{type(exc).__name__}: {exc}"}


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


def construct(cls: Callable[[], Any], name: str) -> Any:
    """An instance of computation ``name``'s class, or the error naming it: a constructor that
    raises fails the same way in every worker and on every retry, so it is the user's to fix."""
    try:
        return cls()
    except Exception as exc:
        raise UserCodeError(f"Computation {name!r} could not be created: {getattr(cls, '__name__', cls)}() raised",
                            got_text=f"{type(exc).__name__}: {exc}",
                            hint="fix its __init__ (it runs in every worker, with no argument) and run again; "
                                 "nothing of it was committed") from exc


def poison_input(name: str, on_error: str, record: InputRecord) -> InputRecord | None:
    """An input record no store can hold (a key or id with a lone surrogate, a timestamp outside
    64 bits) as its dead letter for shard 0 (``ShardBatch.rejected``), or, under ``on_error="fail"``,
    the error naming it; None for a record that is fine."""
    cause = next((f"its {what} {text!r} holds a lone surrogate, which UTF-8 cannot" for what, text in
                  (("key", record.key), ("id", record.id)) if not storable_text(text)), None)
    if cause is None and not MIN_I64 <= record.timestamp <= MAX_I64:
        cause = f"its timestamp {record.timestamp} does not fit in 64 bits"
    if cause is None:
        return None
    what = f"record {record.id!r} of stream {record.stream!r}"
    if on_error != "dead_letter":
        raise BadInputError(f"Computation {name!r} cannot take {what} under key {record.key!r}", got_text=cause,
                            hint="fix the record, or add the computation with on_error='dead_letter' to route "
                                 "such records aside")
    stamp = min(max(record.timestamp, MIN_I64), MAX_I64)
    return InputRecord(record.stream, "", {"computation": name, "key": record.key, "at": f"taking {what}",
                                           "stream": record.stream, "record_id": record.id,
                                           "value": picklable(record.value), "error": cause},
                       stamp, shown_text(record.id))


def invoke_on_timer(ctx: Any, name: str, timer: Any, call: Callable[[], None], what: str,
                    counters: dict[str, int], dead_letters: bool) -> None:
    """One invocation of user code for a fired timer (``ctx``: the shard's ``KeyContext``): an
    exception fails the batch, or, with dead letters, everything the invocation did is undone and
    the timer goes to the dead-letter stream. A key past ``TIMER_REFIRE_LIMIT`` re-fires in the
    batch is not invoked again: its timer is failed the same way (it was deleted on firing)."""
    point = ctx.savepoint() if dead_letters else None
    try:
        if ctx.refires > TIMER_REFIRE_LIMIT:
            raise TimerLoopError(
                f"Key {ctx.key!r} fired more than {TIMER_REFIRE_LIMIT} timers in one batch at or before a time "
                f"it had already fired a timer at", got_text=f"{timer.domain} timer {timer.tag!r} at {timer.timestamp}",
                hint="a timer handler re-arms its timer at or below the low watermark (or the wall clock), so it "
                     "fires again at once, forever: set it later than the timer that fired (timer.timestamp + period)")
        call()
        if point is not None:
            ctx.settle()
    except Exception as exc:
        if point is None:
            raise user_error(name, ctx.key, what, exc) from exc
        ctx.rollback(point)
        ctx.dead_letter(dead_letter_value(name, ctx.key, what, exc, None, None, None), timer.timestamp)
        counters["dead_lettered"] = counters.get("dead_lettered", 0) + 1
