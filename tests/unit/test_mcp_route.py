"""`/mcp`'s dispatch as a table: method, headers and body in, where the request goes out (server.mcp_endpoint.route)."""

from __future__ import annotations

import json

import pytest

from opencode_env.server.mcp_endpoint import NEEDS_BODY, JsonAnswer, route

SSE = {b"accept": b"application/json, text/event-stream"}
PLAIN = {b"accept": b"application/json"}
SESSION = {**SSE, b"mcp-session-id": b"abc"}
VERSION = {**SSE, b"mcp-protocol-version": b"2025-06-18"}


def call(method: str, arguments: object = None) -> bytes:
    params = {"name": "run_rollout", "arguments": arguments} if arguments is not None else {}
    return json.dumps({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}).encode()


VALID = {"instruction": "x", "base_url": "http://127.0.0.1:9/v1", "model": "m"}

TABLE = [
    ("GET", SSE, None, "standard"),
    ("DELETE", SESSION, None, "standard"),
    ("POST", SESSION, None, "standard"),
    ("POST", VERSION, None, "standard"),
    ("POST", SSE, None, NEEDS_BODY),
    ("POST", PLAIN, None, NEEDS_BODY),
    ("POST", SSE, call("initialize"), "standard"),
    ("POST", SSE, call("tools/call", VALID), "stateless"),
    ("POST", SSE, call("tools/list"), "stateless"),
    ("POST", SSE, b"not json", "standard"),
    ("POST", PLAIN, call("tools/call", VALID), "openenv"),
    ("POST", PLAIN, call("tools/list"), "openenv"),
    ("POST", {}, call("tools/call", VALID), "openenv"),
    ("POST", PLAIN, b"[1, 2]", "openenv"),
]


@pytest.mark.parametrize(("method", "headers", "body", "expected"), TABLE)
def test_route(method: str, headers: dict[bytes, bytes], body: bytes | None, expected: str) -> None:
    assert route(method, headers, body) == expected


def test_a_plain_call_with_invalid_arguments_is_answered_here_naming_the_field() -> None:
    answered = route("POST", PLAIN, call("tools/call", {**VALID, "memory_mb": 1}))
    assert isinstance(answered, JsonAnswer)
    error = json.loads(answered.body)
    assert (error["id"], error["error"]["code"], answered.status) == (3, -32602, 200)
    assert "memory_mb" in error["error"]["message"]


def test_the_same_invalid_call_over_the_streamable_transport_is_left_to_it() -> None:
    assert route("POST", SSE, call("tools/call", {**VALID, "memory_mb": 1})) == "stateless"
