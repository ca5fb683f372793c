"""`/mcp` for every client: the standard streamable-HTTP MCP transport, and OpenEnv's JSON-RPC shim beside it.

Standard clients (MCP Inspector, Claude, Cursor, the SDKs) accept SSE on every POST (the transport requires it) and
send their session id or protocol version once negotiated. OpenEnv's clients POST plain JSON-RPC (`tools/list`,
`tools/call`, `openenv/session/*`) with none of that. So only such a plain POST goes to OpenEnv's shim; everything
else (initialize, server/discover, session traffic, GET streams, DELETE, batches) goes to the standard transport,
with sessions (so that a cancel reaches the caller's own call), except a sessionless one-shot call of the
pre-2026 protocol (curl, scripts), which a stateless instance of the same transport serves.
The WebSocket at `/mcp` stays OpenEnv's. `/mcp/stream` is an alias of the standard transport.
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from opencode_env.wire.models import TOOL_NAME, RolloutRequest
from server.disconnect import PendingReplies

STANDARD_PATH = "/mcp"
STANDARD_ALIASES = ("/mcp/stream",)
MODERN_META_KEY = "io.modelcontextprotocol/protocolVersion"
SHIM_METHODS = frozenset({"tools/list", "tools/call"})
INVALID_PARAMS = -32602


Route = Literal["openenv", "stateless", "standard"]


def route_post(headers: list[tuple[bytes, bytes]], body: bytes) -> Route:
    """Where a POST to /mcp goes: OpenEnv's shim, a one-shot stateless call, or the standard transport's sessions."""
    names = {name.lower(): value for name, value in headers}
    try:
        message = json.loads(body)
    except ValueError:
        return "standard"
    method = message.get("method") if isinstance(message, dict) else None
    if not isinstance(method, str) or method == "initialize" or b"mcp-session-id" in names:
        return "standard"
    streamable = b"mcp-protocol-version" in names or b"text/event-stream" in names.get(b"accept", b"").lower()
    if not streamable:
        return "openenv" if method in SHIM_METHODS or method.startswith("openenv/") else "standard"
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    # A request of the sessionless protocol era names its version in _meta; the session manager serves those.
    if isinstance(meta, dict) and MODERN_META_KEY in meta:
        return "standard"
    # A one-shot call without a session (curl, scripts): served statelessly, as before sessions existed.
    return "stateless"


class McpRouter:
    def __init__(
        self, app: ASGIApp, standard: ASGIApp, stateless: ASGIApp, closing: asyncio.Event, replies: PendingReplies
    ) -> None:
        self.app = app
        self.standard = standard
        self.stateless = stateless
        self.closing = closing
        self.replies = replies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.rstrip("/") not in (STANDARD_PATH, *STANDARD_ALIASES):
            await self.app(scope, receive, send)
            return
        standard_scope = {**scope, "path": STANDARD_PATH, "raw_path": STANDARD_PATH.encode()}
        if scope["method"] == "GET":
            # A session's event stream stays open as long as its client; at shutdown it must end, or the server
            # would wait out its whole grace period for clients that are only listening.
            await self.standard(standard_scope, _until(self.closing, receive), send)
            return
        if scope["method"] != "POST":
            await self.standard(standard_scope, receive, send)
            return
        # A POST's answer (a tool call's result) goes out on its own event stream; a shutdown waits for it before
        # uvicorn hears the signal, which ends every event stream at once (sse-starlette's exit hook).
        self.replies.received()
        try:
            await self._post(scope, standard_scope, path, receive, send)
        finally:
            self.replies.answered()

    async def _post(self, scope: Scope, standard_scope: Scope, path: str, receive: Receive, send: Send) -> None:
        body, replay = await _buffered(receive)
        route = route_post(list(scope.get("headers") or []), body)
        if route == "openenv" and path.rstrip("/") == STANDARD_PATH:
            refusal = invalid_params_answer(body)
            if refusal is not None:
                await _answer_json(send, refusal)
                return
            await self.app(standard_scope, replay, send)
        elif route == "stateless":
            await self.stateless(standard_scope, replay, send)
        else:
            await self.standard(standard_scope, replay, send)


def invalid_params_answer(body: bytes) -> bytes | None:
    """A plain JSON-RPC `tools/call` of run_rollout whose arguments are not a valid request, answered as JSON-RPC
    says (-32602, invalid params, naming each field and its problem) instead of OpenEnv's -32603; None otherwise."""
    message = json.loads(body)
    params = message.get("params") if isinstance(message, dict) else None
    if message.get("method") != "tools/call" or not isinstance(params, dict) or params.get("name") != TOOL_NAME:
        return None
    try:
        RolloutRequest.model_validate(params.get("arguments") or {})
    except ValidationError as error:
        problems = [f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()]
        refusal = {"code": INVALID_PARAMS, "message": f"invalid arguments for {TOOL_NAME}: " + "; ".join(problems)}
        return json.dumps({"jsonrpc": "2.0", "id": message.get("id"), "error": refusal}).encode()
    return None


async def _answer_json(send: Send, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _until(closing: asyncio.Event, receive: Receive) -> Receive:
    """`receive`, except that once `closing` is set the stream hears that its client disconnected."""

    async def receive_or_close() -> Message:
        if closing.is_set():
            return {"type": "http.disconnect"}
        message = asyncio.ensure_future(receive())
        closed = asyncio.ensure_future(closing.wait())
        try:
            await asyncio.wait({message, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if message.done():
            return message.result()
        message.cancel()
        return {"type": "http.disconnect"}

    return receive_or_close


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
