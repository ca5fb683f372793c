"""Real HTTP/1.1 servers on loopback for the upstream client's conformance tests, each in a thread of its own.

The same few routes on every server, under /v1:
    echo         the request as the server saw it (JSON, with a content-length)
    stream       PIECES pieces of an SSE-like body, chunked, a few milliseconds apart
    cut          two pieces of a chunked body, then the server drops the connection
    stall        one piece of a chunked body, then nothing until the client goes away
    stall-head   nothing at all (not even the status line) until the client goes away
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import trustme
import uvicorn
from aiohttp import web

PIECES = [f"data: {index}\n\n".encode() for index in range(20)]
PIECE_DELAY_S = 0.002
ServerKind = Literal["uvicorn-h11", "uvicorn-httptools", "aiohttp"]
SERVER_KINDS: tuple[ServerKind, ...] = ("uvicorn-h11", "uvicorn-httptools", "aiohttp")


def echo(method: str, path: str, headers: list[tuple[str, str]], body: bytes, peer: int) -> bytes:
    return json.dumps(
        {"method": method, "path": path, "headers": headers, "body": body.decode(), "peer": peer}
    ).encode()


async def asgi_app(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
):
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    route = scope["path"].removeprefix("/v1/")
    if route == "stall-head":
        await receive()  # returns http.disconnect once the client has gone
        return
    if route == "echo":
        headers = [(name.decode(), value.decode()) for name, value in scope["headers"]]
        raw = echo(scope["method"], scope["path"], headers, body, scope["client"][1])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(raw))]})
        await send({"type": "http.response.body", "body": raw})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    pieces = {"stream": PIECES, "cut": PIECES[:2], "stall": PIECES[:1]}[route]
    for piece in pieces:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
        await asyncio.sleep(PIECE_DELAY_S)
    if route == "cut":
        raise ConnectionAbortedError("the test server drops the connection mid-answer")
    if route == "stall":
        await receive()
        return
    await send({"type": "http.response.body", "body": b""})


class LoopThread:
    """An event loop running in a daemon thread; `run` submits a coroutine to it and waits for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="upstream-test-loop", daemon=True)
        self._thread.start()

    def run(self, work: Awaitable[Any], timeout_s: float = 30) -> Any:
        async def wrapped() -> Any:
            return await work

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout_s)

    def stop(self) -> None:
        """Cancels whatever still runs on the loop (a tunnel's pipes, say), then stops and closes it."""
        self.run(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=15)
        self.loop.close()


def aiohttp_app(release: asyncio.Event) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        route = request.match_info["route"]
        peer = request.transport.get_extra_info("peername")[1] if request.transport else 0
        if route == "stall-head":
            await release.wait()
        if route == "echo":
            raw = echo(request.method, request.path, list(request.headers.items()), body, peer)
            return web.Response(body=raw, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for piece in {"stream": PIECES, "cut": PIECES[:2], "stall": PIECES[:1]}[route]:
            await response.write(piece)
            await asyncio.sleep(PIECE_DELAY_S)
        if route == "cut" and request.transport is not None:
            request.transport.abort()
            return response
        if route == "stall":
            await release.wait()
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/{route}", handle)
    return app


@contextmanager
def aiohttp_server(tls: ssl.SSLContext | None) -> Iterator[int]:
    thread = LoopThread()
    release: asyncio.Event = thread.run(_event())
    runner = web.AppRunner(aiohttp_app(release), access_log=None, shutdown_timeout=1)
    thread.run(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    thread.run(site.start())
    try:
        yield runner.addresses[0][1]
    finally:
        thread.loop.call_soon_threadsafe(release.set)
        thread.run(runner.cleanup())
        thread.stop()


async def _cancel_the_rest() -> None:
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


async def _event() -> asyncio.Event:
    return asyncio.Event()


@contextmanager
def uvicorn_server(http: Literal["h11", "httptools"], certificate: Path | None) -> Iterator[int]:
    config = uvicorn.Config(
        asgi_app,
        host="127.0.0.1",
        port=0,
        http=http,
        loop="asyncio",
        lifespan="off",
        log_level="critical",
        timeout_graceful_shutdown=1,
        ssl_certfile=str(certificate) if certificate else None,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{http}", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            threading.Event().wait(0.005)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=15)


class PrivateCA:
    """A certificate authority made for the test run, and one certificate from it for 127.0.0.1 and localhost."""

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        self.bundle = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.bundle))
        self.server_pem = directory / "server.pem"
        self.ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(self.server_pem))

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_pem)
        return context


@contextmanager
def served(kind: ServerKind, ca: PrivateCA | None = None) -> Iterator[str]:
    """The base URL (.../v1) of a server of this kind, over TLS when given a CA."""
    scheme = "https" if ca else "http"
    if kind == "aiohttp":
        with aiohttp_server(ca.server_context() if ca else None) as port:
            yield f"{scheme}://127.0.0.1:{port}/v1"
    else:
        http: Literal["h11", "httptools"] = "h11" if kind == "uvicorn-h11" else "httptools"
        with uvicorn_server(http, ca.server_pem if ca else None) as port:
            yield f"{scheme}://127.0.0.1:{port}/v1"
