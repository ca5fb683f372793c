"""The capture proxy's own routes (GET /healthz, POST /drain) and its lifespan, as a plain ASGI callable.

Two routes do not need a web framework, and importing one (FastAPI with pydantic and Starlette) tripled the proxy's
start-up CPU (0.14 s without, 0.42 s with); every rollout starts a proxy.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from opencode_env.proxy.asgi import Receive, Scope, Send, send_json

log = logging.getLogger("opencode_env.proxy")
Route = Callable[[], Awaitable[dict[str, Any]]]


class Admin:
    """Routes by (method, path); runs `on_shutdown` when the server stops (the lifespan's shutdown)."""

    def __init__(self, routes: dict[tuple[str, str], Route], on_shutdown: Callable[[], Awaitable[None]]) -> None:
        self._routes = routes
        self._on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, send)

    async def _http(self, scope: Scope, send: Send) -> None:
        route = self._routes.get((scope["method"], scope["path"]))
        if route is not None:
            await send_json(send, 200, await route())
            return
        allowed = sorted(method for method, path in self._routes if path == scope["path"])
        if allowed:
            await send_json(send, 405, {"detail": "Method Not Allowed"}, {"allow": ", ".join(allowed)})
        else:
            await send_json(send, 404, {"detail": "Not Found"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self._on_shutdown()
                except Exception as error:
                    log.exception("the proxy's shutdown failed")
                    await send({"type": "lifespan.shutdown.failed", "message": repr(error)})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return
