"""Parse a captured stream's JSON events fast, with exactly the values the standard library gives.

orjson parses an event several times faster than `json.loads`, and folding a stream is most of the proxy's CPU per
token. It is an accelerator, not a requirement: a sandbox image whose proxy packages predate it parses with `json`.
Where orjson's answer could differ from `json.loads`, `json` decides:
- orjson refuses NaN, Infinity, numbers beyond a double's range and lone surrogates, which `json` accepts: an event
  orjson refuses is parsed again by `json`;
- orjson reads an integer beyond 64 bits as a float, where `json` keeps it whole: a stream with an integer of 19
  digits or more anywhere is parsed by `json` throughout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:
    orjson = None  # type: ignore[assignment]

Loads = Callable[[bytes], Any]
DIGIT_SHAPES = bytes(byte if byte in b"0123456789." else 32 for byte in range(256)).translate(
    bytes.maketrans(b"123456789", b"000000000")
)
"""Every digit becomes 0, a dot stays, anything else becomes a space: an integer literal of 19 digits or more then
reads as a space and 19 zeros, while a fraction's digits follow a dot (C speed, where a regex scan of a stream with
lookbehind took ten times as long)."""
LONG_INTEGER = b" " + b"0" * 19


def has_long_integer(raw: bytes) -> bool:
    """Whether raw may hold an integer of 19 digits or more (or such a run of digits in a string or an exponent)."""
    return (b" " + raw).translate(DIGIT_SHAPES).find(LONG_INTEGER) >= 0


def stdlib_loads(data: bytes) -> Any:
    """`json.loads`, with nesting too deep for its recursion a ValueError like any other bad body (a 400, not a
    RecursionError and a 500); orjson refuses past 1024 levels and hands such a body here."""
    try:
        return json.loads(data)
    except RecursionError as error:
        raise ValueError("JSON nested too deeply") from error


def _orjson_or_json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return stdlib_loads(data)


def loads_for(raw: bytes) -> Loads:
    """A parser for the events of `raw` that gives what `json.loads` gives (raising ValueError where it raises)."""
    if orjson is None or has_long_integer(raw):
        return stdlib_loads
    return _orjson_or_json


def loads(raw: bytes) -> Any:
    """`json.loads(raw)`'s value, parsed by orjson where that gives the same."""
    return loads_for(raw)(raw)
