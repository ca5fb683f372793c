"""JSON and TOML from a task (task.toml, request files, reward.json) parsed within limits: size, nesting depth and
item count are checked by a scan of the text before the parser sees it (Python's parsers recurse once per nesting
level: 400,000 nested arrays are a RecursionError, not a parse error), and a breach is a `ParseLimit` naming the
file and the limit."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ParseLimit(ValueError):
    """The text is over one of its limits; the message names where it came from and the limit."""


@dataclass(frozen=True)
class Limits:
    max_chars: int
    max_depth: int = 32
    max_items: int = 100_000
    """Opening brackets and braces, commas and (TOML) key assignments: values and keys, roughly."""


TASK_TOML = Limits(max_chars=1 << 20)
REQUEST_FILE = Limits(max_chars=256 << 20, max_depth=64, max_items=10_000_000)
REWARD_JSON = Limits(max_chars=1 << 20, max_depth=16, max_items=10_000)

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_TOML_TOKEN = re.compile(r"\"\"\"|'''|[\"'#\[\]{},=]")
_BASIC_END = re.compile(r'[\\"]')
_MULTILINE_BASIC_END = re.compile(r'\\|"""')


def loads_json(text: str, *, where: str, limits: Limits, number: Callable[[str], Any] | None = None) -> Any:
    """`json.loads(text)` once the text is within `limits`; json.JSONDecodeError as json gives it. `number`, when
    given, reads every number and constant (NaN, Infinity) from its text instead of int() and float()."""
    _scan_json(text, where, limits)
    try:
        if number is None:
            return json.loads(text)
        return json.loads(text, parse_int=number, parse_float=number, parse_constant=number)
    except RecursionError:
        raise _over(where, "nesting depth", limits.max_depth) from None


def loads_toml(text: str, *, where: str, limits: Limits) -> dict[str, Any]:
    """`tomllib.loads(text)` once the text is within `limits`; tomllib.TOMLDecodeError as tomllib gives it."""
    _scan_toml(text, where, limits)
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise _over(where, "nesting depth", limits.max_depth) from None


def _over(where: str, what: str, limit: int) -> ParseLimit:
    return ParseLimit(f"{where}: over the {what} limit of {limit}")


def _scan_json(text: str, where: str, limits: Limits) -> None:
    """Depth and item count with every string taken out first (one pass of the regex engine: a request's text is
    mostly strings, and its escapes would cost a step each in a Python loop)."""
    if len(text) > limits.max_chars:
        raise _over(where, "size", limits.max_chars)
    bare = _JSON_STRING.sub('""', text)
    depth = 0
    for found in _BRACKET.finditer(bare):
        if found.group() in "[{":
            depth += 1
            if depth > limits.max_depth:
                raise _over(where, "nesting depth", limits.max_depth)
        else:
            depth = max(0, depth - 1)
    if bare.count(",") + bare.count("[") + bare.count("{") > limits.max_items:
        raise _over(where, "item count", limits.max_items)


def _scan_toml(text: str, where: str, limits: Limits) -> None:
    """Depth and item count outside strings and comments; an unterminated string ends the scan (the parser reports
    it)."""
    if len(text) > limits.max_chars:
        raise _over(where, "size", limits.max_chars)
    depth = items = position = 0
    while (found := _TOML_TOKEN.search(text, position)) is not None:
        token, position = found.group(), found.end()
        if token in "[{":
            depth += 1
            items += 1
            if depth > limits.max_depth:
                raise _over(where, "nesting depth", limits.max_depth)
        elif token in "]}":
            depth = max(0, depth - 1)
        elif token in ",=":
            items += 1
        else:
            position = _string_end(text, position, token)
        if items > limits.max_items:
            raise _over(where, "item count", limits.max_items)


def _string_end(text: str, position: int, opened: str) -> int:
    """Where the string (or TOML comment) that `opened` at `position` ends."""
    if opened == "#":
        end = text.find("\n", position)
    elif opened in ("'", "'''"):
        end = text.find(opened, position)
        end = -1 if end < 0 else end + len(opened)
    else:
        closing = _BASIC_END if opened == '"' else _MULTILINE_BASIC_END
        while (found := closing.search(text, position)) is not None and found.group() == "\\":
            position = found.end() + 1
        end = -1 if found is None else found.end()
    return len(text) if end < 0 else end
