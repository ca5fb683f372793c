"""WebSocket answers whose rollout result was serialized off the event loop.

OpenEnv's WebSocket handler turns each observation into its JSON frame on the event loop: for a rollout's result
(~550 KB as the observation carries it) that is a deep copy and an encode, 7-8 ms per call that every other caller
of the server waits behind. On a WebSocket, `server.direct_call` serializes the result in a worker thread instead,
puts a placeholder in the observation, and this middleware splices the serialized text into the frame as it goes
out. Placeholders live per connection (a context variable set here and read by the tool call, which runs in the
same task), so a frame only ever receives its own connection's results, and they are dropped with the connection.
"""

from __future__ import annotations

import json
import secrets
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PLACEHOLDER_PREFIX = "opencode-env-serialized:"


class Splices:
    """A connection's results serialized and not yet sent, each under a placeholder nobody can guess."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def hold(self, text: str) -> str:
        """The placeholder to put where `text` (one JSON value) belongs."""
        placeholder = PLACEHOLDER_PREFIX + secrets.token_hex(16)
        self._texts[placeholder] = text
        return placeholder

    @property
    def pending(self) -> int:
        return len(self._texts)

    def splice(self, frame: str) -> str:
        """The frame with each held placeholder's JSON string replaced by its text (and released)."""
        for placeholder in [held for held in self._texts if held in frame]:
            frame = frame.replace(json.dumps(placeholder), self._texts.pop(placeholder), 1)
        return frame


_CURRENT: ContextVar[Splices | None] = ContextVar("opencode_env_splices", default=None)


def current() -> Splices | None:
    """The splices of the WebSocket connection this task serves, or None outside one."""
    return _CURRENT.get()


class SpliceSerialized:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        splices = Splices()

        async def send_spliced(message: Message) -> None:
            text = message.get("text")
            if message["type"] == "websocket.send" and splices.pending and isinstance(text, str):
                message = {**message, "text": splices.splice(text)}
            await send(message)

        token = _CURRENT.set(splices)
        try:
            await self.app(scope, receive, send_spliced)
        finally:
            _CURRENT.reset(token)
