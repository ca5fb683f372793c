"""A lean HTTP/1.1 client for the one call the proxy makes: POST a JSON body, stream the answer back.

The proxy forwards one small chunk per token, so the per-read cost of a general client (timeout scopes, event
objects per chunk) dominated its CPU. This client reads straight from asyncio streams, one read per wakeup
whatever number of chunks it holds (opencode_env/proxy/dechunk.py), keeps connections alive in
a small pool (a TLS handshake per turn would add tens of milliseconds), and enforces the idle timeout with one
watchdog per response instead of a timer per read. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opencode_env.proxy.dechunk import ChunkedDecoder


class UpstreamError(Exception):
    """The upstream could not be reached or broke the connection."""


class UpstreamUnreachable(UpstreamError):
    """No connection could be made (refused, DNS, TLS, connect timeout)."""


class UpstreamStalled(UpstreamError):
    """No bytes arrived within the idle timeout."""


class UpstreamDisconnected(UpstreamError):
    """The connection closed before the answer was complete."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    base_path: str
    connect_address: str = ""
    """Where to connect instead of resolving `host` (the address the server vetted); Host and TLS keep `host`."""

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL must be http(s)://host[:port]/path, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


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
                raise UpstreamStalled(f"no bytes from upstream for {self._idle_s}s") from cancelled
            raise
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError) as error:
            raise UpstreamDisconnected(f"the upstream connection broke mid-answer: {error!r}") from error
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
    """Keep-alive connections to one origin."""

    def __init__(self, origin: Origin, *, connect_timeout_s: float, idle_timeout_s: float, size: int = 16) -> None:
        self.origin = origin
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._size = size
        self._idle: list[_Connection] = []
        self._ssl = ssl.create_default_context() if origin.scheme == "https" else None

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
                reader, writer = await asyncio.open_connection(
                    self.origin.connect_address or self.origin.host,
                    self.origin.port,
                    ssl=self._ssl,
                    limit=1 << 20,
                    server_hostname=self.origin.host if self._ssl else None,
                )
        except (OSError, TimeoutError, ssl.SSLError) as error:
            raise UpstreamUnreachable(f"cannot connect to {self.origin.host}:{self.origin.port}: {error!r}") from error
        return _Connection(reader, writer)

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
            f"POST {self.origin.base_path}{path} HTTP/1.1",
            f"host: {self.origin.host_header}",
            f"content-length: {len(body)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        try:
            connection.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await connection.writer.drain()
            async with asyncio.timeout(self._idle_timeout_s):
                status, response_headers = await _read_head(connection.reader)
        except TimeoutError as error:
            connection.close()
            raise UpstreamStalled(f"no answer from upstream within {self._idle_timeout_s}s") from error
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError) as error:
            connection.close()
            raise UpstreamDisconnected(f"the upstream closed the connection: {error!r}") from error
        return UpstreamResponse(status, response_headers, connection, self, self._idle_timeout_s)

    def close(self) -> None:
        for connection in self._idle:
            with contextlib.suppress(RuntimeError):
                connection.close()
        self._idle.clear()


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
