"""An ASGI app that answers `/health` from its first moment while the real app is built in a thread.

Building the real app imports openenv-core's server side (FastAPI, FastMCP, Gradio, pandas: seconds, more on a busy
or cold machine). A Space, a container health check or a supervisor only needs to know the process is alive, so
`/health` answers at once. `/ready` answers at once too: 200 once the tool can be called, 503 with a Retry-After
before (or the reason, if building the app failed), for a load balancer or a script that would rather poll. Every
other request waits for the app (up to `ready_wait_s`), so a script that starts the server, sees `/health` and calls
the tool just works with any client; one that waits longer than that gets 503 with a Retry-After, and every request
gets the reason if building the app failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from opencode_env.wire import READY_PATH, STARTING

log = logging.getLogger("opencode_env.server")
ANSWERED_AT_ONCE = ("/health", READY_PATH)
READY_WAIT_S = 120.0
TRY_AGAIN_LATER = 1013
DENIAL_EXTENSION = "websocket.http.response"


def _headers(body: dict[str, str]) -> list[tuple[bytes, bytes]]:
    length = str(len(json.dumps(body).encode())).encode()
    return [(b"content-type", b"application/json"), (b"content-length", length), (b"retry-after", b"2")]


class StagedApp:
    def __init__(
        self, build: Callable[[], Any], built: Callable[[], None] | None = None, *, ready_wait_s: float = READY_WAIT_S
    ) -> None:
        self._build = build
        self._built = built
        self._ready_wait_s = ready_wait_s
        self._app: ASGIApp | None = None
        self._failure: str | None = None
        self._settled = asyncio.Event()
        self._stop = asyncio.Event()
        self._running: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "http" and scope["path"] == READY_PATH:
            await self._answer_readiness(send)
            return
        if self._app is None and scope.get("path") not in ANSWERED_AT_ONCE:
            await self._wait_until_settled()
        if self._app is not None:
            await self._app(scope, receive, send)
        elif scope["type"] == "http":
            await self._answer_while_starting(scope, send)
        elif scope["type"] == "websocket":
            await self._refuse_websocket(scope, receive, send)

    async def _wait_until_settled(self) -> None:
        """Until the app is built or its build failed, at most `ready_wait_s`."""
        try:
            await asyncio.wait_for(self._settled.wait(), timeout=self._ready_wait_s)
        except TimeoutError:
            log.warning("a request waited %.0f s for the server to start and got 503", self._ready_wait_s)

    async def _answer_while_starting(self, scope: Scope, send: Send) -> None:
        if scope["path"] == "/health" and self._failure is None:
            status, body = 200, {"status": "healthy"}
        else:
            status, body = 503, {"error": self._failure or STARTING}
        await send({"type": "http.response.start", "status": status, "headers": _headers(body)})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    async def _answer_readiness(self, send: Send) -> None:
        if self._app is not None:
            status, body = 200, {"status": "ready"}
        else:
            status, body = 503, {"error": self._failure or STARTING}
        await send({"type": "http.response.start", "status": status, "headers": _headers(body)})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    async def _refuse_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        body = {"error": self._failure or STARTING}
        if DENIAL_EXTENSION in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", "status": 503, "headers": _headers(body)})
            await send({"type": "websocket.http.response.body", "body": json.dumps(body).encode()})
            return
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": "the server is starting"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        self._running = asyncio.ensure_future(self._serve())
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        self._stop.set()
        self._settled.set()
        await self._running
        await send({"type": "lifespan.shutdown.complete"})

    async def _serve(self) -> None:
        """Build the app, then hold its lifespan open (entered and left in this one task) until shutdown."""
        try:
            app = await asyncio.to_thread(self._build)
            if self._built is not None:
                self._built()
        except Exception as error:
            log.exception("the server could not be built")
            self._failure = f"the server could not start: {type(error).__name__}: {error}"
            self._settled.set()
            return
        async with app.router.lifespan_context(app):
            self._app = app
            self._settled.set()
            log.info("the server is ready")
            await self._stop.wait()
