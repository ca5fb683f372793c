"""`/mcp` for every client: the standard streamable-HTTP MCP transport, and OpenEnv's JSON-RPC shim beside it.

Standard clients (MCP Inspector, Claude, Cursor, the SDKs) accept SSE on every POST (the transport requires it) and
send their session id or protocol version once negotiated. OpenEnv's clients POST plain JSON-RPC (`tools/list`,
`tools/call`, `openenv/session/*`) with none of that. So only such a plain POST goes to OpenEnv's shim; everything
else (initialize, server/discover, session traffic, GET streams, DELETE, batches) goes to the standard transport.
The WebSocket at `/mcp` stays OpenEnv's. `/mcp/stream` is an alias of the standard transport.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

STANDARD_PATH = "/mcp"
STANDARD_ALIASES = frozenset({"/mcp/stream", "/mcp/stream/"})
# Every standard client sends one of these: the session it was given, the protocol version it negotiated, or the
# Accept header the streamable-HTTP transport requires (JSON and SSE). OpenEnv's httpx client sends none.
STANDARD_HEADERS = frozenset({b"mcp-session-id", b"mcp-protocol-version"})
SHIM_METHODS = frozenset({"tools/list", "tools/call"})


def is_openenv_shim_call(headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """Whether a POST to /mcp is OpenEnv's JSON-RPC rather than the standard transport."""
    for name, value in headers:
        lowered = name.lower()
        if lowered in STANDARD_HEADERS or (lowered == b"accept" and b"text/event-stream" in value.lower()):
            return False
    try:
        message = json.loads(body)
    except ValueError:
        return False
    method = message.get("method") if isinstance(message, dict) else None
    return isinstance(method, str) and (method in SHIM_METHODS or method.startswith("openenv/"))


class McpRouter:
    def __init__(self, app: ASGIApp, standard: ASGIApp) -> None:
        self.app = app
        self.standard = standard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path in STANDARD_ALIASES:
            await self.standard({**scope, "path": STANDARD_PATH, "raw_path": STANDARD_PATH.encode()}, receive, send)
            return
        if path.rstrip("/") != STANDARD_PATH:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self.standard(scope, receive, send)
            return
        body, replay = await _buffered(receive)
        target = self.app if is_openenv_shim_call(list(scope.get("headers") or []), body) else self.standard
        await target({**scope, "path": STANDARD_PATH}, replay, send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body, and a `receive` that hands it out again before passing on what follows."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"", _replaying([message], receive)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    return body, _replaying([{"type": "http.request", "body": body, "more_body": False}], receive)


def _replaying(pending: list[Message], receive: Receive) -> Receive:
    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
