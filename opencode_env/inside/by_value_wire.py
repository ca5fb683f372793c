"""Values across the by-value boundary: plain data as tagged JSON, in length-prefixed frames.

The test grader's by-value mode runs the code under test in a process of its own (another identity) and reaches it
only through this encoding, so nothing of the code's (an `__eq__`, a `__hash__`, a `__repr__`) ever runs in the
tests' process: what comes back is rebuilt there from plain types alone. A value is `None`, `True`/`False`, or a
pair `[tag, payload]`: `i` an int (decimal text), `f` a float (`float.hex`), `s` a str, `y` bytes (base64), `l` a
list, `t` a tuple, `S` a set, `F` a frozenset, `d` a dict (a list of key/value pairs). Bounded: MAX_DEPTH levels,
MAX_NODES values, MAX_INT_DIGITS digits, MAX_FRAME_BYTES per frame. `encode` refuses anything else with an error
naming where the value sits and the rule; `decode` and `read_frame` map any bytes to a value or a WireError.
Runs in the sandbox's own Python (3.8 or newer), so it uses the standard library alone and nothing newer.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import socket
import struct
from typing import Any

MAX_FRAME_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_NODES = 1_000_000
MAX_INT_DIGITS = 4000
HEADER = struct.Struct(">I")
INTEGER = re.compile(rf"-?[0-9]{{1,{MAX_INT_DIGITS}}}", re.ASCII)
PLAIN = "None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset"
SEQUENCES = {"l": list, "t": tuple, "S": set, "F": frozenset}


class Refused(ValueError):
    """A value that cannot cross by value: the message names where it sits and the rule it breaks."""


class WireError(Exception):
    """Bytes that are not a frame or a value of this encoding."""


def encode(value: object, where: str = "value") -> object:
    """The tagged tree of `value` (JSON-ready), or Refused. Subclasses of plain types cross as their plain base."""
    return _Encoder().tree(value, where, 0)


class _Encoder:
    def __init__(self) -> None:
        self.nodes = 0

    def tree(self, value: object, where: str, depth: int) -> object:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise Refused(f"{where}: more than {MAX_NODES} values in one message")
        if depth > MAX_DEPTH:
            raise Refused(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if value is None or value is True or value is False:
            return value
        if isinstance(value, int):
            digits = int.__repr__(int(value))
            if len(digits.lstrip("-")) > MAX_INT_DIGITS:
                raise Refused(f"{where}: an int of more than {MAX_INT_DIGITS} digits")
            return ["i", digits]
        if isinstance(value, float):
            return ["f", float.hex(float(value))]
        if isinstance(value, str):
            return ["s", str.__str__(value)]
        if isinstance(value, (bytes, bytearray)):
            return ["y", base64.b64encode(bytes(value)).decode("ascii")]
        if isinstance(value, dict):
            pairs = list(dict.items(value))
            return ["d", [self.pair(key, item, where, depth) for key, item in pairs]]
        if isinstance(value, (list, tuple, set, frozenset)):
            tag = next(tag for tag, kind in SEQUENCES.items() if isinstance(value, kind))
            items = [self.tree(item, f"{where}[{index}]", depth + 1) for index, item in enumerate(list(value))]
            return [tag, items]
        raise Refused(f"{where}: a {_type_name(value)} cannot cross by value (plain data only: {PLAIN})")

    def pair(self, key: object, item: object, where: str, depth: int) -> list[object]:
        label = f"{where}[{_short(key)}]"
        return [self.tree(key, f"{label} (key)", depth + 1), self.tree(item, label, depth + 1)]


def _type_name(value: object) -> str:
    kind = type(value)
    return f"{type.__getattribute__(kind, '__module__')}.{type.__getattribute__(kind, '__qualname__')}"


def _short(key: object) -> str:
    if key is None or isinstance(key, (bool, int, float, str, bytes)):
        text = repr(key) if type(key) in (type(None), bool, int, float, str, bytes) else "..."
        return text if len(text) <= 40 else text[:37] + "..."
    return "..."


def decode(tree: object) -> Any:
    """The value a tagged tree stands for, built from plain types alone; WireError for anything else."""
    return _Decoder().value(tree, 0)


class _Decoder:
    def __init__(self) -> None:
        self.nodes = 0

    def value(self, tree: object, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise WireError(f"a value past {MAX_NODES} values or {MAX_DEPTH} levels")
        if tree is None or tree is True or tree is False:
            return tree
        if type(tree) is not list or len(tree) != 2 or type(tree[0]) is not str:
            raise WireError("a value is null, a boolean or a [tag, payload] pair")
        tag, payload = tree
        if tag in ("i", "f", "s", "y"):
            if type(payload) is not str:
                raise WireError(f"the payload of {tag!r} is text")
            return _scalar(tag, payload)
        if type(payload) is not list:
            raise WireError(f"the payload of {tag!r} is a list")
        if tag == "d":
            return self.mapping(payload, depth)
        kind = SEQUENCES.get(tag)
        if kind is None:
            raise WireError(f"unknown tag {tag[:20]!r}")
        items = [self.value(item, depth + 1) for item in payload]
        try:
            return kind(items)
        except TypeError as error:
            raise WireError(f"a {kind.__name__} of unhashable items: {error}") from None

    def mapping(self, payload: list[object], depth: int) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for pair in payload:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("a dict item is a [key, value] pair")
            key = self.value(pair[0], depth + 1)
            try:
                result[key] = self.value(pair[1], depth + 1)
            except TypeError as error:
                raise WireError(f"an unhashable dict key: {error}") from None
        return result


def _scalar(tag: str, payload: str) -> object:
    if tag == "s":
        return payload
    if tag == "i":
        if not INTEGER.fullmatch(payload):
            raise WireError(f"an int is at most {MAX_INT_DIGITS} ASCII digits")
        return int(payload)
    if tag == "f":
        if len(payload) > 64:
            raise WireError("a float is float.hex text")
        try:
            return float.fromhex(payload)
        except (ValueError, OverflowError) as error:
            raise WireError(f"a float is float.hex text: {error}") from None
    try:
        return base64.b64decode(payload.encode("ascii"), validate=True)
    except (ValueError, binascii.Error) as error:
        raise WireError(f"bytes are base64 text: {error}") from None


def _no_constant(name: str) -> object:
    raise WireError(f"{name} is not part of the encoding")


def dumps(message: dict[str, object]) -> bytes:
    """One frame: the message as JSON, its length first. Refused when it is past MAX_FRAME_BYTES."""
    payload = json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    if len(payload) > MAX_FRAME_BYTES:
        raise Refused(f"the message is {len(payload)} bytes encoded, over the {MAX_FRAME_BYTES} byte limit")
    return HEADER.pack(len(payload)) + payload


def loads(payload: bytes) -> dict[str, Any]:
    """A frame's payload as a message (a JSON object), or WireError: total over any bytes."""
    try:
        message = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        raise WireError(f"a frame is a JSON object: {str(error)[:200]}") from None
    if type(message) is not dict:
        raise WireError("a frame is a JSON object")
    return message


def read_frame(connection: socket.socket) -> dict[str, Any]:
    """The next message on `connection` (its timeout applies to each read); WireError when the peer closed, sent
    a frame past MAX_FRAME_BYTES or bytes that do not parse. socket.timeout (an OSError) when it is slow."""
    (length,) = HEADER.unpack(_read_exactly(connection, HEADER.size))
    if length > MAX_FRAME_BYTES:
        raise WireError(f"a frame of {length} bytes, over the {MAX_FRAME_BYTES} byte limit")
    return loads(_read_exactly(connection, length))


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = connection.recv(min(left, 2**20))
        if not chunk:
            raise WireError("the other process closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
