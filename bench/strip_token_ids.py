"""An ASGI middleware for vLLM's `--middleware` that removes `return_token_ids` from every request body: a vLLM
0.32 then answers as one older than 0.10.2 does (that field did not exist; unknown fields are ignored), so
bench.vllm_probe can show the refusal of a real vLLM without token ids. Loaded by vLLM's Python (stdlib only):

    PYTHONPATH=/path/to/checkout vllm serve ... --middleware bench.strip_token_ids.StripTokenIds
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Message, Receive, Send], Awaitable[None]]
REMOVED = "return_token_ids"


class StripTokenIds:
    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and REMOVED in parsed:
            del parsed[REMOVED]
            body = json.dumps(parsed).encode()
        headers = [(name, value) for name, value in scope["headers"] if name.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, "headers": headers}, replay, send)
