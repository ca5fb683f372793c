"""A lean HTTP/1.1 client for the proxy's one call: POST a JSON body, stream the answer back, through the operator's
HTTP proxy when there is one (ProxyRoute). It reads straight from asyncio streams, keeps a small connection pool and
one idle watchdog per response, because per-chunk costs dominated the proxy's CPU: httpx measured 1.3-2.1x its CPU
per streamed token (bench/upstream_client.py; rerun it before replacing this). Standard library only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from opencode_env.proxy.dechunk import ChunkedDecoder
from opencode_env.proxy.route import RESERVED_PREFIX, Origin, ProxyRoute, proxy_route

__all__ = [
    "RESERVED_PREFIX",
    "Origin",
    "ProxyRoute",
    "UpstreamDisconnected",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamStalled",
    "UpstreamUnreachable",
    "proxy_route",
]

READ_LIMIT = 1 << 20
BROKEN = (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError, ValueError)
"""What reading or writing a connection raises when the peer breaks it or sends what is not HTTP/1.1."""


class UpstreamError(Exception):
    """The upstream could not be reached or broke the connection."""


class UpstreamUnreachable(UpstreamError):
    """No connection could be made (refused, DNS, TLS, connect timeout, a proxy's refusal)."""


class UpstreamStalled(UpstreamError):
    """No bytes arrived within the idle timeout."""


class UpstreamDisconnected(UpstreamError):
    """The connection closed before the answer was complete."""


class _Environ(Enum):
    DEFAULT = "from os.environ"


FROM_ENVIRON = _Environ.DEFAULT
"""UpstreamPool's default route: proxy_route(origin, os.environ, prefix=RESERVED_PREFIX) at construction."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def close(self) -> None:
        self.writer.close()


class _Watchdog:
    """Cancels a task when `touch()` has not been called for `idle_s` seconds."""

    def __init__(self, idle_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle_s = idle_s
        self._task = asyncio.current_task()
        self.last = self._loop.time()
        self.fired = False
        self._handle = self._loop.call_at(self.last + idle_s, self._check)

    def touch(self) -> None:
        self.last = self._loop.time()

    def _check(self) -> None:
        due = self.last + self._idle_s
        if self._loop.time() >= due:
            self.fired = True
            if self._task is not None:
                self._task.cancel()
        else:
            self._handle = self._loop.call_at(due, self._check)

    def stop(self) -> None:
        self._handle.cancel()


@dataclass
class UpstreamResponse:
    status: int
    headers: dict[str, str]
    _connection: _Connection
    _pool: UpstreamPool
    _idle_s: float
    _finished: bool = field(default=False)

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.iter_body()])

    async def iter_body(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (chunked encoding removed); raises an UpstreamError subclass."""
        watchdog = _Watchdog(self._idle_s)
        try:
            async for piece in self._body(watchdog):
                yield piece
            self._finished = True
        except asyncio.CancelledError as cancelled:
            if watchdog.fired:
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                raise UpstreamStalled(f"no bytes from {self._pool.where} for {self._idle_s}s") from cancelled
            raise
        except BROKEN as error:
            raise UpstreamDisconnected(f"the connection to {self._pool.where} broke mid-answer: {error!r}") from error
        finally:
            watchdog.stop()
            self.release()

    async def _body(self, watchdog: _Watchdog) -> AsyncIterator[bytes]:
        reader = self._connection.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            decoder = ChunkedDecoder()
            while not decoder.finished:
                data = await reader.read(65536)
                if not data:
                    raise asyncio.IncompleteReadError(b"", None)
                watchdog.touch()
                if piece := decoder.feed(data):
                    yield piece
            if decoder.leftover:
                self.headers["connection"] = "close"
        elif "content-length" in self.headers:
            remaining = int(self.headers["content-length"])
            while remaining > 0:
                piece = await reader.read(min(remaining, 65536))
                if not piece:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(piece)
                watchdog.touch()
                yield piece
        else:
            while piece := await reader.read(65536):
                watchdog.touch()
                yield piece
            self.headers["connection"] = "close"

    def release(self) -> None:
        """Return a cleanly finished keep-alive connection to the pool; close anything else."""
        if self._finished and self.headers.get("connection", "").lower() != "close":
            self._pool.put(self._connection)
        else:
            self._connection.close()
        self._finished = False


class UpstreamPool:
    """Keep-alive connections to one origin, directly or through one HTTP proxy."""

    def __init__(
        self,
        origin: Origin,
        *,
        connect_timeout_s: float,
        idle_timeout_s: float,
        size: int = 16,
        route: ProxyRoute | Literal[_Environ.DEFAULT] | None = FROM_ENVIRON,
    ) -> None:
        self.origin = origin
        self.route = proxy_route(origin, os.environ, prefix=RESERVED_PREFIX) if route is FROM_ENVIRON else route
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._size = size
        self._idle: list[_Connection] = []
        self._ssl = ssl.create_default_context() if origin.scheme == "https" else None
        self._proxy_ssl = ssl.create_default_context() if self.route and self.route.scheme == "https" else None
        self.where = f"{origin.host}:{origin.port}" + (f" through the proxy {self.route.name}" if self.route else "")
        """The upstream as error messages name it."""
        absolute = self.route is not None and self._ssl is None
        self._request_target = f"http://{origin.target}{origin.base_path}" if absolute else origin.base_path
        authorization = self.route.authorization if absolute and self.route else ""
        self._proxy_header = f"proxy-authorization: {authorization}\r\n" if authorization else ""

    def put(self, connection: _Connection) -> None:
        if len(self._idle) < self._size and not connection.reader.at_eof():
            connection.reused = True
            self._idle.append(connection)
        else:
            connection.close()

    async def _connect(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.reader.at_eof():
                return connection
            connection.close()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                if self.route is None:
                    reader, writer = await asyncio.open_connection(
                        self.origin.connect_address or self.origin.host,
                        self.origin.port,
                        ssl=self._ssl,
                        limit=READ_LIMIT,
                        server_hostname=self.origin.host if self._ssl else None,
                    )
                else:
                    reader, writer = await self._through_proxy(self.route)
        except (*BROKEN, TimeoutError, ssl.SSLError) as error:
            raise UpstreamUnreachable(f"cannot connect to {self.where}: {error!r}") from error
        return _Connection(reader, writer)

    async def _through_proxy(self, route: ProxyRoute) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the proxy; for an https origin, a CONNECT tunnel with TLS to the origin inside it. The
        CONNECT carries the target and the proxy's credentials only: no header of the request goes to the proxy."""
        reader, writer = await asyncio.open_connection(
            route.host,
            route.port,
            ssl=self._proxy_ssl,
            limit=READ_LIMIT,
            server_hostname=route.host if self._proxy_ssl else None,
        )
        if self._ssl is None:
            return reader, writer
        try:
            lines = [f"CONNECT {self.origin.target} HTTP/1.1", f"host: {self.origin.target}"]
            if route.authorization:
                lines.append(f"proxy-authorization: {route.authorization}")
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            await writer.drain()
            status, _ = await _read_head(reader)
            if not 200 <= status < 300:
                raise UpstreamUnreachable(f"the proxy {route.name} answered {status} to CONNECT {self.origin.target}")
            await writer.start_tls(self._ssl, server_hostname=self.origin.host)
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """Send the request and read the status and headers (waiting at most the idle timeout for them)."""
        connection = await self._connect()
        try:
            return await self._exchange(connection, path, body, headers)
        except UpstreamDisconnected:
            if not connection.reused:
                raise
            # A pooled connection the server had already closed answers nothing: the request never ran.
            return await self._exchange(await self._connect_fresh(), path, body, headers)

    async def _connect_fresh(self) -> _Connection:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
        return await self._connect()

    async def _exchange(
        self, connection: _Connection, path: str, body: bytes, headers: dict[str, str]
    ) -> UpstreamResponse:
        lines = [
            f"POST {self._request_target}{path} HTTP/1.1",
            f"host: {self.origin.host_header}",
            f"content-length: {len(body)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        head = "\r\n".join(lines) + "\r\n" + self._proxy_header + "\r\n"
        try:
            connection.writer.write(head.encode("latin-1") + body)
            await connection.writer.drain()
            async with asyncio.timeout(self._idle_timeout_s):
                status, response_headers = await _read_head(connection.reader)
        except TimeoutError as error:
            connection.close()
            raise UpstreamStalled(f"no answer from {self.where} within {self._idle_timeout_s}s") from error
        except BROKEN as error:
            connection.close()
            raise UpstreamDisconnected(f"{self.where} closed the connection: {error!r}") from error
        return UpstreamResponse(status, response_headers, connection, self, self._idle_timeout_s)

    def close(self) -> None:
        for connection in self._idle:
            with contextlib.suppress(RuntimeError):
                connection.close()
        self._idle.clear()

    async def aclose(self) -> None:
        """close(), then wait (a second at most) for the connections to be gone, so a loop closing next finds none."""
        closing = [connection.writer.wait_closed() for connection in self._idle]
        self.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1):
                await asyncio.gather(*closing, return_exceptions=True)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readuntil(b"\r\n")
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:100]!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers
