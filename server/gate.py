"""The ASGI middleware that applies the access policy, tells a refused client why in the form its client shows,
and hands on who an admitted request is from (`caller_of`, `current_caller`).

MCP clients show a JSON-RPC error's message (not an HTTP status), WebSocket clients can read the body of a denial
response; everyone else gets `{"error": reason}`.
"""

from __future__ import annotations

import contextvars
import json

from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from opencode_env.server.auth import OPEN_PATHS, AccessPolicy, Refusal
from opencode_env.viewer.rows import OPERATOR, Caller

MCP_PATHS = frozenset({"/mcp", "/mcp/", "/mcp/stream", "/mcp/stream/"})
DENIAL_EXTENSION = "websocket.http.response"
UNAUTHORIZED_JSONRPC_CODE = -32001
CALLER_KEY = "opencode_env.caller"
_current: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("opencode_env_caller", default=None)


def caller_of(connection: HTTPConnection) -> Caller:
    """Who sent an admitted request (the gate put it in its scope); a request that never passed the gate owns
    nothing and sees nothing."""
    caller = connection.scope.get(CALLER_KEY)
    return caller if isinstance(caller, Caller) else Caller(id="")


def current_caller() -> Caller:
    """Who sent the request this code runs for: the gate sets it for the request's task and what it starts (OpenEnv's
    sessions call the tool from there). Outside any request (stdio, in-process) it is the operator."""
    return _current.get() or OPERATOR


class AccessGate:
    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        method = scope.get("method", "GET")
        admitted = self.policy.admit(list(scope.get("headers") or []), client[0] if client else None, method)
        if isinstance(admitted, Caller):
            token = _current.set(admitted)
            try:
                await self.app({**scope, CALLER_KEY: admitted}, receive, send)
            finally:
                _current.reset(token)
        elif scope["type"] == "websocket":
            await refuse_websocket(scope, receive, send, admitted)
        else:
            await _refuse_http(scope, receive, send, admitted)


def refusal_body(path: str, refusal: Refusal) -> bytes:
    if path in MCP_PATHS:
        error = {"code": UNAUTHORIZED_JSONRPC_CODE, "message": refusal.reason}
        return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    return json.dumps({"error": refusal.reason}).encode()


def _headers(refusal: Refusal, body: bytes) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return headers


async def _refuse_http(scope: Scope, receive: Receive, send: Send, refusal: Refusal) -> None:
    headers = {"www-authenticate": "Bearer"} if refusal.status == 401 else None
    body = refusal_body(scope["path"], refusal)
    await Response(body, status_code=refusal.status, headers=headers, media_type="application/json")(
        scope, receive, send
    )


async def refuse_websocket(scope: Scope, receive: Receive, send: Send, refusal: Refusal) -> None:
    await receive()
    if DENIAL_EXTENSION in (scope.get("extensions") or {}):
        body = json.dumps({"error": refusal.reason}).encode()
        start = {"type": "websocket.http.response.start", "status": refusal.status, "headers": _headers(refusal, body)}
        await send(start)
        await send({"type": "websocket.http.response.body", "body": body})
        return
    # WebSocket close reasons are limited to 123 bytes.
    await send(
        {"type": "websocket.close", "code": 1008, "reason": refusal.reason.encode()[:123].decode(errors="ignore")}
    )
