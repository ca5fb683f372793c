"""The by-value encoding is total: any value round-trips to an equal value of the same types or is refused with an
error naming where it sits and the rule; any bytes a server sends parse to a value or to a WireError."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opencode_env.inside import by_value_wire as wire

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
HASHABLE = st.recursive(
    SCALARS, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=4), max_leaves=20
)
PLAIN = st.recursive(
    SCALARS | st.floats(),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(HASHABLE, inner, max_size=5)
        | st.sets(HASHABLE, max_size=5)
        | st.frozensets(HASHABLE, max_size=5)
    ),
    max_leaves=40,
)


def same(left: Any, right: Any) -> bool:
    """Equal and of the very same types all the way down (NaN equal to NaN, -0.0 told from 0.0)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, float):
        if math.isnan(left):
            return math.isnan(right)
        return left == right and math.copysign(1, left) == math.copysign(1, right)
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[key], right[key]) for key in left)
    return bool(left == right)


def through_a_frame(value: object) -> object:
    frame = wire.dumps({"value": wire.encode(value)})
    return wire.decode(wire.loads(frame[wire.HEADER.size :])["value"])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(PLAIN)
def test_plain_data_round_trips(value: object) -> None:
    assert same(through_a_frame(value), value)


class Sneaky:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


ANYTHING = st.recursive(
    PLAIN | st.just(Sneaky()) | st.just(len) | st.just(object()) | st.just(range(3)) | st.just(1j),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(ANYTHING)
def test_any_value_crosses_or_is_refused_by_name(value: object) -> None:
    try:
        crossed = through_a_frame(value)
    except wire.Refused as refused:
        why = str(refused)
    else:
        assert same(crossed, value)
        return
    assert why.startswith("value"), why
    assert "cannot cross by value" in why or "limit" in why or "deeper" in why, why


def test_the_limits_are_refused_with_their_rule() -> None:
    nested: list[object] = []
    for _ in range(wire.MAX_DEPTH + 2):
        nested = [nested]
    cycle: list[object] = []
    cycle.append(cycle)
    cases = {
        "nested deeper than": nested,
        "cycle deeper than": cycle,
        "of more than 4000 digits": 10**4001,
        "a builtins.object cannot cross": {"k": [object()]},
    }
    for rule, value in cases.items():
        with pytest.raises(wire.Refused, match=rule.split(" ", 1)[1] if rule.startswith("cycle") else rule):
            wire.encode(value)
    with pytest.raises(wire.Refused, match=r"value\['k'\]\[0\]"):
        wire.encode({"k": [object()]})
    with pytest.raises(wire.Refused, match="byte limit"):
        wire.dumps({"value": wire.encode("x" * wire.MAX_FRAME_BYTES)})


def parse(payload: bytes) -> object:
    return wire.decode(wire.loads(payload).get("value"))


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_any_bytes_parse_to_a_value_or_a_wire_error(payload: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        parse(payload)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.sampled_from("ifsyltSFd"),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=30,
)
EDGES = [
    b'{"value": ["i", "' + b"9" * 5000 + b'"]}',
    b'{"value": ' + b"9" * 5000 + b"}",
    b'{"value": ["f", "0x1p99999"]}',
    b'{"value": ["f", "nan"]}',
    b'{"value": NaN}',
    b'{"value": ["S", [["l", []]]]}',
    b'{"value": ["d", [[["l", []], null]]]}',
    b'{"value": ["y", "!!"]}',
    b'{"value": ["i", "\\u0661"]}',
    b"\xef\xbb\xbf{}",
    b'{"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"value": ["l", ' + b'["l", ' * 200 + b"[]" + b"]" * 200 + b"]}",
    b"\xff\xfe{",
]


@settings(max_examples=500)
@given(JSON | st.sampled_from(EDGES))
def test_any_json_a_server_sends_is_a_value_or_a_wire_error(shaped: object) -> None:
    payload = shaped if isinstance(shaped, bytes) else json.dumps({"value": shaped}).encode()
    with contextlib.suppress(wire.WireError):
        parse(payload)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_byte_stream_is_frames_or_a_wire_error(stream: bytes) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(5)
        sender = threading.Thread(target=lambda: (theirs.sendall(stream), theirs.shutdown(socket.SHUT_WR)))
        sender.start()
        try:
            while True:
                wire.read_frame(ours)
        except wire.WireError:
            pass
        finally:
            sender.join()


def test_a_frame_past_the_limit_is_refused_unread() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(wire.HEADER.pack(wire.MAX_FRAME_BYTES + 1))
        with pytest.raises(wire.WireError, match="byte limit"):
            wire.read_frame(ours)
