"""The ``ctx`` user code receives (``KeyContext``): one shard batch's, rebound from key to key.
It holds the key's state (decoded on first use, written once at the key's end if it changed), its
timers, its productions, and what an invocation may undo (savepoints, for dead letters)."""

from __future__ import annotations

from pickle import HIGHEST_PROTOCOL, dumps
from typing import Any, Mapping, Protocol, Sequence

from ..errors import OptionError, UnknownStreamError, UserCodeError
from ..model import ComputationOptions, Timer, check_domain, to_millis
from .batch import DueTimer, Production, produced
from ..names import STATE_TTL_TIMER, id_prefix
from .poison import MAX_I64, MIN_I64, check_millis, check_text, encode_value, picklable, shown_text, storable_text

__all__ = ["KeyContext", "ValueCheck", "new_counters", "add_user_counters", "ENGINE_COUNTERS"]

_UNSET: Any = object()


class ValueCheck(Protocol):
    """A typed stream's schema as the engine sees it (``headrace.schema.StreamSchema``)."""

    fingerprint: str  # the schema exactly: segments name the schema their field columns were written with

    def misfits(self, values: Sequence[Any]) -> list[int]:
        """The positions of the values that do not fit."""
        ...

    def require(self, stream: str, value: Any) -> None: ...


class KeyContext:
    """The ``ctx`` user code receives; rebound from key to key within one shard batch."""

    __slots__ = (
        "key", "low_watermark", "_codec", "_raw", "_value", "_touched", "_outputs", "_owner",
        "_timestamp", "_productions", "_id_prefix", "_seq", "_timers", "_key_sets", "_key_deletes",
        "timer_sets", "timer_deletes", "_late_before", "late_productions", "_schemas", "user_counters",
        "_ttl", "_uses", "wall_clock", "_expired", "refires", "_fired_high", "_settled",
    )

    def __init__(self, owner: str, options: ComputationOptions, outputs: frozenset[str] | None,
                 id_prefix: str, late_before: int, schemas: Mapping[str, ValueCheck] | None = None):
        self._owner = owner
        self._schemas = schemas or {}
        self._codec = options.codec
        self._outputs = outputs
        self._id_prefix = id_prefix
        self._seq = 0
        self._productions: list[Production] = []
        self.timer_sets: list[DueTimer] = []
        self.timer_deletes: list[tuple[str, str]] = []
        self._late_before = late_before
        self.late_productions = 0
        self.user_counters: dict[str, int] = {}
        self.key = ""
        self.low_watermark = 0
        self._timestamp = 0  # the record's or timer's being processed: a production's default
        self._ttl = (options.state_ttl_ms, options.state_ttl_domain) if options.state_ttl_ms is not None else None
        self._uses = 0  # accesses to ctx.state: an invocation that made one renews a state TTL
        self.wall_clock = 0

    # -- binding ----------------------------------------------------------------------------------

    def bind(self, key: str, raw: bytes | None, timers: dict[str, DueTimer]) -> None:
        self.key = key
        self._raw = raw
        self._value = _UNSET
        self._settled: bytes | None = None
        self._touched = False
        self._uses = 0
        self._expired = False  # its stored state expired in this batch: a new value is a change
        self._timers = timers
        self._key_sets: dict[str, DueTimer] = {}
        self._key_deletes: set[str] = set()
        self.refires, self._fired_high = 0, {"watermark": MIN_I64 - 1, "wall": MIN_I64 - 1}

    def fired(self, timer: DueTimer) -> None:
        if timer.timestamp <= self._fired_high[timer.domain]:
            self.refires += 1  # a timer at or before one already fired for the key in this batch: a re-arm loop?
        else:
            self._fired_high[timer.domain] = timer.timestamp
        del self._timers[timer.tag]
        self._key_sets.pop(timer.tag, None)
        self._key_deletes.add(timer.tag)

    def finish_key(self) -> tuple[str, bytes | None] | None:
        """Close the key: collect its timer changes; return its state write, if any."""
        write = self.state_write() if self._touched else None
        if self._key_sets:
            self.timer_sets.extend(self._key_sets.values())
        if self._key_deletes:
            self.timer_deletes.extend((self.key, tag) for tag in sorted(self._key_deletes - self._key_sets.keys()))
        return write

    def _expiry(self, used_at: int) -> int:
        ttl_ms, domain = self._ttl  # type: ignore[misc]
        return (used_at if domain == "watermark" else self.wall_clock) + ttl_ms

    def renew(self, uses_before: int) -> None:
        """After an invocation: if it used the state, the state TTL's timer moves to a TTL from
        now (or goes, with the state)."""
        if self._ttl is None or self._uses == uses_before:
            return
        if self._value is None:
            self._drop_timer(STATE_TTL_TIMER)
        else:
            self._put_timer(DueTimer(self.key, STATE_TTL_TIMER, self._ttl[1], self._expiry(self._timestamp)))

    def expire_before(self, at: int) -> bool:
        """A record at ``at`` (event time; the batch's wall clock for a wall TTL) comes: if the
        state expired before it, it is gone now. True if it was."""
        timer = self._timers.get(STATE_TTL_TIMER)
        if timer is None or timer.timestamp > (at if timer.domain == "watermark" else self.wall_clock):
            return False
        self.expire(timer)
        return True

    def expire(self, timer: DueTimer) -> None:
        """The key's state TTL timer fired (or was due before a record): its state is gone."""
        self.fired(timer)
        self._value = None
        self._touched = self._expired = True

    def savepoint(self) -> tuple[Any, ...]:
        """Everything one invocation may change, to undo it if the invocation fails (dead letters)."""
        raw = (self._raw if self._value is _UNSET else None if self._value is None else
               self._settled if self._settled is not None else self._encode(self._value))
        self._settled = None
        return (raw, self._value is not _UNSET, self._touched, dict(self._timers), dict(self._key_sets),
                set(self._key_deletes), len(self._productions), self.late_productions, dict(self.user_counters))

    def settle(self) -> None:
        """With dead letters, after an invocation: the state it left must encode, or the invocation
        fails (not the batch, at the key's end); the bytes serve the next savepoint."""
        if self._touched and self._value is not _UNSET and self._value is not None:
            self._settled = self._encode(self._value)

    def rollback(self, point: tuple[Any, ...]) -> None:
        self._settled = None
        raw, decoded, touched, timers, key_sets, key_deletes, produced, late, self.user_counters = point
        self._value = (None if raw is None else self._codec.decode(raw)) if decoded else _UNSET
        self._touched = touched
        self._timers.clear()
        self._timers.update(timers)
        self._key_sets, self._key_deletes = key_sets, key_deletes
        del self._productions[produced:]
        self.late_productions = late

    def dead_letter(self, value: dict[str, Any], timestamp: int) -> None:
        self._seq += 1
        self._productions.append(Production(f"{self._owner}.dead_letter", shown_text(self.key), picklable(value),
                                            min(max(timestamp, MIN_I64), MAX_I64), f"{self._id_prefix}{self._seq}"))

    def state_write(self) -> tuple[str, bytes | None] | None:
        """The key's state write, if its state changed (assigned, or mutated in place)."""
        if not self._touched:
            return None
        value = self._value
        if value is None:
            return (self.key, None) if self._raw is not None else None
        encoded = self._settled if self._settled is not None else self._encode(value)  # settled: the last invocation's
        return None if encoded == self._raw and not self._expired else (self.key, encoded)

    def _encode(self, value: Any) -> bytes:
        try:
            return self._codec.encode(value)
        except Exception as exc:
            raise UserCodeError(
                f"Computation {self._owner!r} cannot save the state of key {self.key!r} with the "
                f"{self._codec.name!r} codec",
                got_text=f"{type(value).__name__} value: {type(exc).__name__}: {exc}",
                hint="keep state to plain data (dicts, lists, numbers, strings) or objects the codec can "
                     "serialize (no open files, locks, lambdas or generators), or pick another codec=",
            ) from exc

    # -- the public context -------------------------------------------------------------------------

    @property
    def state(self) -> Any:
        if self._value is _UNSET:
            self._value = None if self._raw is None else self._codec.decode(self._raw)
        self._touched = True
        self._uses += 1
        return self._value

    @state.setter
    def state(self, value: Any) -> None:
        self._value = value
        self._touched = True
        self._uses += 1

    @property
    def state_expires_at(self) -> int | None:
        """With ``state_ttl_ms``: when the key's state expires if it is used now (a time in the
        TTL's domain), so that a timer of one's own can come first; None without a TTL."""
        return None if self._ttl is None else self._expiry(self._timestamp)

    def set_timer(self, tag: str, timestamp: Any, domain: str = "watermark") -> None:
        if type(timestamp) is not int or not MIN_I64 <= timestamp <= MAX_I64:
            timestamp = check_millis(to_millis(timestamp, "timer timestamp"), "timer timestamp")
        if domain != "watermark":
            check_domain(domain)
        self._put_timer(DueTimer(self.key, _user_tag(tag), domain, timestamp))

    def delete_timer(self, tag: str) -> None:
        self._drop_timer(_user_tag(tag))

    def _put_timer(self, timer: DueTimer) -> None:
        self._timers[timer.tag] = timer
        self._key_sets[timer.tag] = timer
        self._key_deletes.discard(timer.tag)

    def _drop_timer(self, tag: str) -> None:
        self._timers.pop(tag, None)
        self._key_sets.pop(tag, None)
        self._key_deletes.add(tag)

    def count(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to the computation's counter ``counter``, committed with the batch (exact, as
        the engine's own counters are; ``Harness.counters``, ``headrace status``)."""
        if (type(counter) is not str or counter in ENGINE_COUNTERS or type(n) is not int or not storable_text(counter)
                or not MIN_I64 <= n <= MAX_I64):
            raise OptionError("ctx.count takes a counter name of your own and an int",
                              got=(counter, n), hint=f"e.g. ctx.count('too_late'); the engine's own counters "
                                                     f"{sorted(ENGINE_COUNTERS)} are its to keep")
        self.user_counters[counter] = self.user_counters.get(counter, 0) + n

    def produce(self, stream: str, value: Any, timestamp: Any = None, key: str | None = None) -> None:
        if self._outputs is not None and stream not in self._outputs:
            raise UnknownStreamError(
                f"Computation {self._owner!r} produced to undeclared stream {stream!r}",
                got=stream,
                hint=f"declare it: topology.add(..., outputs={sorted(self._outputs | {stream})})",
            )
        if stream in self._schemas:
            self._schemas[stream].require(stream, value)
        elif self._outputs is None and not (type(stream) is str and stream.isascii()):
            check_text(stream, "stream name")
        if timestamp is None:
            timestamp = self._timestamp
        elif type(timestamp) is not int or not MIN_I64 <= timestamp <= MAX_I64:
            timestamp = check_millis(to_millis(timestamp, "production timestamp"), "production timestamp")
        if key is not None and not (type(key) is str and key.isascii()):
            check_text(key, "production's key")
        try:  # pickled now, inside the invocation, not at commit: the segment writer reuses the bytes
            raw = dumps(value, HIGHEST_PROTOCOL)
        except Exception:
            raw = encode_value(value, f"value produced to {stream!r}")  # raises what, got and hint
        if timestamp < self._late_before:
            self.late_productions += 1
        self._seq += 1
        self._productions.append(produced(stream, key, value, timestamp, f"{self._id_prefix}{self._seq}", raw))


def _user_tag(tag: Any) -> str:
    tag = str(tag)
    check_text(tag, "timer tag")
    if tag == STATE_TTL_TIMER:
        raise OptionError(f"Timer tag {tag!r} is the framework's own (the state TTL's timer)", got=tag,
                          hint="give your timer another tag")
    return tag


def new_counters() -> dict[str, int]:
    return {"records": 0, "late_dropped": 0, "late_delivered": 0, "duplicates": 0, "timers_fired": 0}


ENGINE_COUNTERS = frozenset([*new_counters(), "late_productions", "dead_lettered", "state_expired"])


def add_user_counters(counters: dict[str, int], ctx: KeyContext) -> None:
    for name, n in ctx.user_counters.items():
        counters[name] = counters.get(name, 0) + n
