"""State codecs: how a computation's per-key state becomes bytes in the store."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from .errors import OptionError

__all__ = ["Codec", "codec_named", "CODECS"]


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
