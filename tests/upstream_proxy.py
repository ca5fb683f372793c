"""A small real HTTP proxy for the tests: `CONNECT host:port` tunnels and absolute-form requests, loopback only.

It records the head of every request it is sent (a CONNECT, or the first request of an absolute-form connection),
can demand Basic credentials (407 without them), and refuses any target that is not a loopback address, so no test
packet leaves the machine whatever a bug in the client under test sends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.upstream_servers import LoopThread


@dataclass
class RecordingProxy:
    credentials: str = ""
    """user:password the proxy demands, or empty for none."""
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Future[None]] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(host, port)
        self._writers.add(writer)
        return reader, writer

    async def shut(self, server: asyncio.Server) -> None:
        """Stop listening, close every connection, and wait for every connection's task to end."""
        server.close()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if self.credentials and header(head, "proxy-authorization") != self.expected():
            await answer(writer, "407 Proxy Authentication Required", 'proxy-authenticate: Basic realm="test"\r\n')
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            address = host.strip("[]")
        else:
            parts = urlsplit(target)
            address, port = parts.hostname or "", str(parts.port or 80)
        if not loopback(address):
            await answer(writer, "403 Forbidden", "")
            return
        upstream_reader, upstream_writer = await self.open(address, int(port))
        if method == "CONNECT":
            await answer(writer, "200 Connection established", "", close=False)
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
            return
        back = asyncio.ensure_future(pipe(upstream_reader, writer))
        try:
            while head:
                await self._forward(head, reader, upstream_writer)
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
        finally:
            upstream_writer.close()
            await back

    async def _forward(self, head: bytes, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter) -> None:
        """One absolute-form request to the origin in origin form, without the proxy's credentials."""
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ")
        origin_form = urlsplit(target)._replace(scheme="", netloc="").geturl() or "/"
        kept = [line for line in header_lines if not line.lower().startswith("proxy-authorization:")]
        upstream.write("\r\n".join([f"{method} {origin_form} {version}", *kept]).encode("latin-1"))
        upstream.write(await reader.readexactly(int(header(head, "content-length") or 0)))
        await upstream.drain()

    def expected(self) -> str:
        return "Basic " + base64.b64encode(self.credentials.encode()).decode()

    def connect_heads(self) -> list[bytes]:
        return [head for head in self.heads if head.startswith(b"CONNECT ")]


def header(head: bytes, name: str) -> str | None:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def answer(writer: asyncio.StreamWriter, status: str, headers: str, *, close: bool = True) -> None:
    extra = "content-length: 0\r\n" if close else ""
    writer.write(f"HTTP/1.1 {status}\r\n{headers}{extra}\r\n".encode())
    await writer.drain()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(RuntimeError):
            writer.close()


@contextmanager
def running_test_proxy(
    *, credentials: str = "", tls: ssl.SSLContext | None = None
) -> Iterator[tuple[str, RecordingProxy]]:
    """The proxy's URL (http:// or, with a server TLS context, https://) and the proxy, in a thread of its own."""
    proxy = RecordingProxy(credentials)
    thread = LoopThread()
    server = thread.run(asyncio.start_server(proxy.serve, "127.0.0.1", 0, ssl=tls))
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", proxy
    finally:
        thread.run(proxy.shut(server))
        thread.stop()
