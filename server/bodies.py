"""Request bodies on every HTTP route: bounded as their bytes stream in, before anything parses them, and never echoed
back in an error.

`BodyLimit` sits behind the access gate (so it knows the caller) and in front of every route. It reads each body
whole before the route sees any of it (every route reads whole bodies anyway): a body past OPENCODE_ENV_MAX_BODY_MB
(declared by its Content-Length, or counted chunk by chunk as it streams) is answered 413 at once, and the bodies one
caller has in the server at once (from their first byte until their request is answered) are bounded by
OPENCODE_ENV_BODY_MB_PER_CALLER, past which its next body is answered 429: one tenant's uploads cannot take the
server's memory from the others. A refused body never reaches a route: handed a disconnect halfway, FastAPI kept
what it had read in an exception's frames, a reference cycle only a full collection frees (21 GB of server RSS in
8 minutes of bench.tenant_flood's three 300 MB uploads at a time).

`unechoed_validation_errors` replaces FastAPI's 422 answer, which repeats each invalid field's value (a whole body
for a body of the wrong type), by one naming each field and its problem only.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from opencode_env.server.auth import Refusal
from opencode_env.server.gate import CALLER_KEY, refusal_body
from opencode_env.settings import variable

MIB = 2**20
ECHOED_KEYS = ("input", "ctx", "url")
"""What FastAPI and pydantic put in a validation error beside its location and message: the value itself, the
values of the rule it broke, a link."""


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int, per_caller_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.per_caller_bytes = per_caller_bytes
        self.in_flight: Counter[str] = Counter()
        """Body bytes of each caller's requests not yet answered."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        caller = scope.get(CALLER_KEY)
        charged = "" if caller is None or caller.operator else caller.id
        declared = _content_length(scope) or 0
        refusal = self._refusal(charged, declared, declared)
        received = 0
        try:
            if refusal is None:
                body, received, refusal = await self._read(charged, receive)
            if refusal is not None:
                await _refuse(scope, send, refusal)
                return
            await self.app(scope, _replaying(body, receive), send)
        finally:
            self._discharge(charged, received)

    async def _read(self, caller_id: str, receive: Receive) -> tuple[list[Message], int, Refusal | None]:
        """The request's body, whole, as the message(s) to hand the route, and its size; or why it is refused (what
        was read of it is dropped here, so nothing of a refused body outlives its refusal)."""
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return [message], received, None
            chunk = message.get("body", b"")
            refusal = self._refusal(caller_id, received + len(chunk), len(chunk))
            if refusal is not None:
                return [], received, refusal
            chunks.append(chunk)
            received += len(chunk)
            if caller_id:
                self.in_flight[caller_id] += len(chunk)
            if not message.get("more_body", False):
                whole = b"".join(chunks)
                chunks.clear()
                return [{"type": "http.request", "body": whole, "more_body": False}], received, None

    def _discharge(self, caller_id: str, received: int) -> None:
        if caller_id and received:
            self.in_flight[caller_id] -= received
            if self.in_flight[caller_id] <= 0:
                del self.in_flight[caller_id]

    def _refusal(self, caller_id: str, request_bytes: int, more: int) -> Refusal | None:
        """Why a request with `request_bytes` of body so far (`more` of them not yet charged) goes no further."""
        if request_bytes > self.max_bytes:
            return Refusal(
                413,
                f"the request body is over {self.max_bytes // MIB} MiB, this server's limit "
                f"({variable('max_body_mb')})",
            )
        if caller_id and self.in_flight[caller_id] + more > self.per_caller_bytes:
            return Refusal(
                429,
                f"this caller's request bodies in the server would pass {self.per_caller_bytes // MIB} MiB, its share "
                f"({variable('body_mb_per_caller')}): wait for its earlier requests to be answered",
            )
        return None


def _replaying(pending: list[Message], receive: Receive) -> Receive:
    """`receive` for the route: the body read here, then whatever the connection says next (a disconnect)."""

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or []:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(scope: Scope, send: Send, refusal: Refusal) -> None:
    body = refusal_body(scope["path"], refusal)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def unechoed(errors: Any) -> Any:
    """Validation errors without the values they were about: each keeps its location, type and message."""
    if not isinstance(errors, list | tuple):
        return errors
    return [
        {key: value for key, value in error.items() if key not in ECHOED_KEYS} if isinstance(error, dict) else error
        for error in errors
    ]


def unechoed_validation_errors(app: FastAPI) -> None:
    """`app` answers an invalid request (FastAPI's own validation, or a route's 422 with pydantic's errors) naming
    each field and its problem, never its value."""

    async def on_invalid_request(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return JSONResponse({"detail": unechoed(error.errors())}, status_code=422)

    async def on_http_error(request: Request, error: Exception) -> Any:
        assert isinstance(error, HTTPException)
        detail: Any = error.detail
        if isinstance(detail, list):
            error = HTTPException(error.status_code, unechoed(detail), error.headers)
        return await http_exception_handler(request, error)

    app.add_exception_handler(RequestValidationError, on_invalid_request)
    app.add_exception_handler(HTTPException, on_http_error)
