"""The proxy's own ASGI routes and lifespan, driven as an ASGI server drives them."""

from __future__ import annotations

from typing import Any

from opencode_env.proxy.admin import Admin
from opencode_env.proxy.asgi import Message


async def stay_open() -> None:
    return None


async def run_lifespan(admin: Admin) -> list[str]:
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message["type"])

    await admin({"type": "lifespan"}, receive, send)
    return sent


async def test_the_server_s_shutdown_closes_the_proxy() -> None:
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    sent = await run_lifespan(Admin({}, on_shutdown=close))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert closed == [True]


async def test_a_failed_close_is_reported_to_the_server_not_dropped() -> None:
    async def close() -> None:
        raise OSError("trace file gone")

    sent = await run_lifespan(Admin({}, on_shutdown=close))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.failed"]


async def test_routes_answer_by_method_and_path() -> None:
    async def health() -> dict[str, Any]:
        return {"ok": True}

    admin = Admin({("GET", "/healthz"): health}, on_shutdown=stay_open)
    answers: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        answers.append(message)

    await admin({"type": "http", "method": "GET", "path": "/healthz"}, receive, send)
    assert answers[0]["status"] == 200
    assert answers[1]["body"] == b'{"ok": true}'
