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


class PendingReplies:
    """Requests received and not yet answered (WebSocket messages, which OpenEnv answers once each, and POSTs to
    /mcp), so that a shutdown can let the answers go out before uvicorn closes every WebSocket and event stream."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def received(self) -> None:
        self._count += 1
        self._idle.clear()

    def answered(self, how_many: int = 1) -> None:
        self._count -= how_many
        if self._count <= 0:
            self._idle.set()

    async def settled(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)


class CancelOnDisconnect:
    def __init__(self, app: ASGIApp, replies: PendingReplies | None = None) -> None:
        self.app = app
        self.replies = replies or PendingReplies()

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

        replies = self.replies
        awaiting = 0

        async def receive_request() -> Message:
            nonlocal awaiting
            message = await inbox.get()
            if message["type"] == "websocket.receive":
                awaiting += 1
                replies.received()
            return message

        async def send_reply(message: Message) -> None:
            nonlocal awaiting
            await send(message)
            if message["type"] == "websocket.send" and awaiting > 0:
                awaiting -= 1
                replies.answered()

        reader = asyncio.ensure_future(pump())
        try:
            await self.app(scope, receive_request, send_reply)
        except asyncio.CancelledError:
            if not client_gone or handler is None:
                raise
            handler.uncancel()
        except WebSocketDisconnect:
            # The handler tried to answer a client that had already gone: the disconnect it reports is ours.
            if not client_gone:
                raise
        finally:
            if awaiting:
                replies.answered(awaiting)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
