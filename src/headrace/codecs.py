"""State codecs: how a computation's per-key state becomes bytes in the store."""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from .errors import OptionError

__all__ = ["Codec", "codec_named", "CODECS", "fingerprint", "Pickled", "safe_loads", "shown_value"]


@dataclass(frozen=True)
class Codec:
    name: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def _bytes_encode(value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise OptionError(
            "The 'bytes' codec stores raw bytes only",
            got_text=f"a value of type {type(value).__name__}",
            hint="assign bytes to ctx.state, or choose codec='pickle' (any object), 'json' or 'msgpack'",
        )
    return bytes(value)


CODECS: dict[str, Codec] = {
    "pickle": Codec("pickle", lambda v: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL), pickle.loads),
    "json": Codec(
        "json",
        lambda v: json.dumps(v, separators=(",", ":"), sort_keys=True).encode(),
        lambda b: json.loads(b),
    ),
    "msgpack": Codec(
        "msgpack",
        lambda v: msgpack.packb(v, use_bin_type=True, strict_types=False),
        lambda b: msgpack.unpackb(b, raw=False, strict_map_key=False),
    ),
    "bytes": Codec("bytes", _bytes_encode, bytes),
}


def codec_named(codec: str | Codec) -> Codec:
    if isinstance(codec, Codec):
        return codec
    try:
        return CODECS[codec]
    except (KeyError, TypeError):
        raise OptionError(
            "Unknown state codec",
            got=codec,
            hint=f"use one of {sorted(CODECS)} or a headrace.codecs.Codec(name, encode, decode)",
        ) from None


def fingerprint(codec: Codec) -> str:
    """What a store records of a computation's codec: a built-in codec's name; for one of your
    own, its name and where its functions live (two codecs of one name that differ there differ)."""
    if CODECS.get(codec.name) is codec:
        return codec.name

    def where(f: Callable[..., Any]) -> str:
        return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', type(f).__name__)}"
    return f"{codec.name} ({where(codec.encode)}, {where(codec.decode)})"


# What a safe decode may construct besides the data pickle spells with opcodes of its own (None, bool,
# int, float, str, bytes, bytearray, list, tuple, dict, set, frozenset): types whose constructors
# only build a value. Nothing else is looked up, so nothing else runs.
_SAFE_GLOBALS = {
    ("builtins", "complex"), ("builtins", "set"), ("builtins", "frozenset"), ("collections", "OrderedDict"),
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"), ("datetime", "timedelta"),
    ("datetime", "timezone"), ("decimal", "Decimal"),
}


@dataclass(frozen=True)
class Pickled:
    """A pickled value a safe decode would not construct: shown by its size, never unpickled."""

    size: int

    def __repr__(self) -> str:
        return f"<pickled, {self.size} bytes; pass --unpickle to decode it (unpickling runs code the store's writer chose)>"


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def safe_loads(data: bytes) -> Any:
    """``data`` unpickled if it holds plain data only (see ``_SAFE_GLOBALS``), else ``Pickled``:
    no class or function the bytes name is looked up, so no code they choose runs."""
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except Exception:  # any malformed or non-plain pickle: shown, not decoded
        return Pickled(len(data))


def shown_value(data: bytes, unpickle: bool) -> Any:
    """A pickled value as an inspection tool shows it: decoded in full only when asked to."""
    return pickle.loads(data) if unpickle else safe_loads(data)
