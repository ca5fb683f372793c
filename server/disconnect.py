"""Cancel a connection's work when its client goes away.

OpenEnv's WebSocket handler awaits a step before it reads the next message, so it would notice a vanished client
only after the rollout ended, minutes later. This middleware reads the connection's messages in the background
and cancels the handling task as soon as the client disconnects; the rollout's cancellation path then closes its
sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

DISCONNECTS = frozenset({"websocket.disconnect", "http.disconnect"})


class CancelOnDisconnect:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        inbox: asyncio.Queue[Message] = asyncio.Queue()
        handler = asyncio.current_task()
        client_gone = False

        async def pump() -> None:
            nonlocal client_gone
            while True:
                message = await receive()
                await inbox.put(message)
                if message["type"] in DISCONNECTS:
                    client_gone = True
                    if handler is not None:
                        handler.cancel()
                    return

        reader = asyncio.ensure_future(pump())
        try:
            await self.app(scope, inbox.get, send)
        except asyncio.CancelledError:
            if not client_gone or handler is None:
                raise
            handler.uncancel()
        except WebSocketDisconnect:
            # The handler tried to answer a client that had already gone: the disconnect it reports is ours.
            if not client_gone:
                raise
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
