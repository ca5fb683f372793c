"""`/mcp` over HTTP, where two protocols meet by their own conventions: MCP's streamable HTTP transport (MCP
Inspector, Claude, Cursor, the SDKs, fastmcp, curl) and OpenEnv's plain JSON-RPC (its `MCPToolClient` in production
mode). `/mcp` over WebSocket never reaches here: it is OpenEnv's route.

A POST is told apart by the headers the streamable transport requires (an `Accept` naming `text/event-stream` on
every POST; a session id or protocol version once negotiated); a POST without them is OpenEnv's. The body is read
only where headers cannot decide: a sessionless streamable POST is either an `initialize` (a new session, so that a
cancel reaches the caller's own call) or a one-shot call (curl, scripts), which a stateless instance of the same
transport answers; and a plain `tools/call` of run_rollout whose arguments are invalid is answered here with
JSON-RPC's -32602 naming each field (OpenEnv's shim would answer -32603, an internal error).

Also here, because they concern this endpoint's streams: a session's GET event stream ends when the server starts
closing (uvicorn would otherwise wait out its grace period for clients that only listen), and every POST is counted
until answered, so a shutdown lets the answers go out first.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from opencode_env.server.disconnect import PendingReplies
from opencode_env.server.gate import CALLER_KEY
from opencode_env.server.session_quota import SessionQuota, over_quota
from opencode_env.server.tool import invalid_arguments
from opencode_env.wire import TOOL_NAME, RolloutRequest

INVALID_PARAMS = -32602
STREAMABLE_HEADERS = (b"mcp-session-id", b"mcp-protocol-version")
MAX_READ_BODY_BYTES = 64 * 2**20
"""A body read here (to look inside) is refused past this: the largest valid request (files and protected files at
their limits, every JSON escape) is well under it."""
MAX_INITIALIZE_BYTES = 64 * 1024
"""A request that opens an MCP session is refused past this: the session keeps what it says about its client
(`clientInfo`, capabilities) for its life, so this bounds each session's memory (a real client's is under 1 KiB;
this leaves room for icons). With the session cap and the idle timeout, abandoned sessions cost at most
(sessions x this) however large the clientInfo a caller sends."""


class BodyTooLarge(Exception):
    """The body went past MAX_READ_BODY_BYTES."""


class McpEndpoint:
    def __init__(
        self,
        *,
        standard: ASGIApp,
        stateless: ASGIApp,
        openenv: ASGIApp,
        closing: asyncio.Event,
        replies: PendingReplies,
        quota: SessionQuota,
    ) -> None:
        self.standard = standard
        self.stateless = stateless
        self.openenv = openenv
        self.closing = closing
        self.replies = replies
        self.quota = quota

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The transports are mounted at /mcp; /mcp/stream (an alias) and a trailing slash reach them there too. The
        # caller is the session's principal: the SDK serves a session only to the credential that opened it.
        scope = {**scope, "path": "/mcp", "raw_path": b"/mcp", "user": _principal(scope)}
        if scope["method"] != "POST":
            await self._to(route(scope["method"], {}, None), scope, receive, send)
            return
        self.replies.received()
        try:
            await self._post(scope, receive, send)
        finally:
            self.replies.answered()

    async def _post(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {name.lower(): value for name, value in scope.get("headers") or []}
        target = route("POST", headers, None)
        if target is NEEDS_BODY:
            try:
                body, receive = await _buffered(receive)
            except BodyTooLarge:
                await _answer_json(scope, receive, send, JsonAnswer(_too_large(), 413))
                return
            target = route("POST", headers, body)
        if target != "standard" or b"mcp-session-id" in headers:
            await self._to(target, scope, receive, send)
            return
        if not await self.quota.open(scope.get(CALLER_KEY), lambda: self._to(target, scope, receive, send)):
            await _answer_json(scope, receive, send, JsonAnswer(_over_quota(self.quota.per_caller), 503))

    async def _to(self, target: Routed, scope: Scope, receive: Receive, send: Send) -> None:
        if isinstance(target, JsonAnswer):
            await _answer_json(scope, receive, send, target)
        elif target == "standard" and scope["method"] == "GET":
            await self.standard(scope, _until(self.closing, receive), send)
        elif target in ("standard", "stateless", "openenv"):
            await {"standard": self.standard, "stateless": self.stateless, "openenv": self.openenv}[target](
                scope, receive, send
            )
        else:
            raise AssertionError(f"a POST routed without its body: {target}")


def _principal(scope: Scope) -> AuthenticatedUser | None:
    caller = scope.get(CALLER_KEY)
    if caller is None:
        return None
    return AuthenticatedUser(AccessToken(token="", client_id=caller.id, scopes=[]))


@dataclass(frozen=True)
class JsonAnswer:
    """Answered here, without a transport."""

    body: bytes
    status: int = 200


Target = Literal["standard", "stateless", "openenv"]
NEEDS_BODY: Literal["needs_body"] = "needs_body"
Routed = Target | JsonAnswer | Literal["needs_body"]


def route(method: str, headers: Mapping[bytes, bytes], body: bytes | None) -> Routed:
    """Where one request to /mcp goes, from its method, its headers (lower-case names) and, when those cannot
    decide, its body: `NEEDS_BODY` until it is given. Pure: the table in tests/unit/test_mcp_route.py is its spec."""
    if method != "POST" or any(name in headers for name in STREAMABLE_HEADERS):
        return "standard"
    if body is None:
        return NEEDS_BODY
    message = _json_object(body)
    if b"text/event-stream" not in headers.get(b"accept", b"").lower():
        refusal = invalid_params_answer(message) if message is not None else None
        return JsonAnswer(refusal) if refusal is not None else "openenv"
    if message is not None and message.get("method") != "initialize":
        return "stateless"
    if len(body) > MAX_INITIALIZE_BYTES:
        return JsonAnswer(_too_large_to_open(len(body)), 413)
    return "standard"


def invalid_params_answer(message: dict[str, object]) -> bytes | None:
    """A plain JSON-RPC `tools/call` of run_rollout whose arguments are not a valid request, answered as JSON-RPC
    says (-32602, invalid params, naming each field and its problem); None otherwise."""
    params = message.get("params")
    if message.get("method") != "tools/call" or not isinstance(params, dict) or params.get("name") != TOOL_NAME:
        return None
    try:
        RolloutRequest.model_validate(params.get("arguments") or {})
    except ValidationError as error:
        refusal = {"code": INVALID_PARAMS, "message": invalid_arguments(error)}
        return json.dumps({"jsonrpc": "2.0", "id": message.get("id"), "error": refusal}).encode()
    return None


def _json_object(body: bytes) -> dict[str, object] | None:
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def _too_large() -> bytes:
    error = {"code": INVALID_PARAMS, "message": f"the request body is over {MAX_READ_BODY_BYTES} bytes"}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


def _over_quota(per_caller: int) -> bytes:
    error = {"code": -32000, "message": over_quota(per_caller)}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


def _too_large_to_open(size: int) -> bytes:
    message = (
        f"initialize: the request that opens a session is {size} bytes, over the {MAX_INITIALIZE_BYTES} this server "
        "keeps per session (clientInfo and capabilities)"
    )
    error = {"code": INVALID_PARAMS, "message": message}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


async def _answer_json(scope: Scope, receive: Receive, send: Send, answer: JsonAnswer) -> None:
    await Response(answer.body, status_code=answer.status, media_type="application/json")(scope, receive, send)


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
    """The whole request body, and a `receive` that hands it out again before passing on what follows; BodyTooLarge
    past MAX_READ_BODY_BYTES (read no further)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"", _replaying([message], receive)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_READ_BODY_BYTES:
            raise BodyTooLarge
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
