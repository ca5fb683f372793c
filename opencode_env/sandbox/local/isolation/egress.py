"""The egress proxy: the only way out of a local rollout's network namespace.

It listens inside the namespace (see netns.py) and runs in the server's event loop. HTTP `CONNECT host:port` and
absolute-URI requests (what pip, npm, curl and OpenCode send with HTTPS_PROXY / HTTP_PROXY set) are allowed to
public addresses when the rollout has internet, and always to the exact host:port pairs named in the policy (the
model in black_box mode). Without internet, anything else is refused before its name is looked up: a DNS query is
itself a way out. Every address a name resolves to is judged by class (addresses.py: private, loopback,
link-local, multicast, reserved, documentation, forms that embed such an IPv4 address, and this machine's own
addresses are refused) unless the operator's trusted-hosts list names the host. The name is resolved once and the
vetted address is the one connected to, so a DNS answer cannot change between the check and the connection.
Every attempt is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from opencode_env.sandbox.addresses import (
    IPAddress,
    IPNetwork,
    literal_address,
    read_host_networks,
    refusal,
    resolved_addresses,
)
from opencode_env.settings import variable

log = logging.getLogger("opencode_env.egress")
HEADER_LIMIT = 64 * 1024
CONNECT_TIMEOUT_S = 15.0
MAX_ATTEMPTS_RECORDED = 1000
MAX_CONNECTIONS = 256
"""Egress connections one sandbox may hold at once; more are closed as they arrive (the server's descriptors are
shared by every rollout)."""


NO_INTERNET = "this rollout has no internet access (network='model_only')"

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]


@dataclass(frozen=True)
class EgressPolicy:
    internet: bool
    allowed: frozenset[tuple[str, int]] = frozenset()
    trusted_hosts: frozenset[str] = frozenset()
    """Names the operator trusts even on private addresses (a package mirror on the local network, a model on the
    host's network): reachable with internet, and as an allowed endpoint without it."""


def parse_trusted_hosts(listed: str) -> frozenset[str]:
    """The names in a comma-separated list (the operator's OPENCODE_ENV_EGRESS_TRUSTED_HOSTS), lower-cased."""
    return frozenset(name.strip().lower() for name in listed.split(",") if name.strip())


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    return resolved_addresses(await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM))


@dataclass(frozen=True)
class Attempt:
    host: str
    port: int
    allowed: bool
    reason: str
    at: float


@dataclass
class EgressProxy:
    policy: EgressPolicy
    rollout: str
    attempts: list[Attempt] = field(default_factory=list)
    resolve: Resolver = system_resolver
    host_networks: frozenset[IPNetwork] | None = None
    """This machine's addresses, read at start unless given."""
    max_connections: int = MAX_CONNECTIONS
    _server: asyncio.AbstractServer | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, listener: socket.socket) -> None:
        if self.host_networks is None:
            self.host_networks = await asyncio.to_thread(read_host_networks)
        listener.setblocking(False)
        self._server = await asyncio.start_server(self._handle, sock=listener)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= self.max_connections:
            self._record("", 0, None, f"over {self.max_connections} connections at once")
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError) as e:
            log.debug("%s egress connection ended: %s", self.rollout, e)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > HEADER_LIMIT:
            raise ValueError("request head too large")
        request_line, _, rest = head.partition(b"\r\n")
        method, target, version = request_line.decode("latin-1").split(" ", 2)
        if method == "CONNECT":
            host, port = _split_host_port(target, 443)
            forward = b""
        else:
            host, port, path = _absolute_target(target)
            forward = f"{method} {path} {version}\r\n".encode("latin-1") + rest
        address, reason = await self._vet(host, port)
        if address is None:
            await _answer(writer, "403 Forbidden", reason)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(address, port), timeout=CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as error:
            log.info("%s egress %s:%d via %s failed: %s", self.rollout, host, port, address, error)
            await _answer(writer, "502 Bad Gateway", f"cannot connect to {address}: {error}")
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                upstream_writer.write(forward)
            await _pipe_both(reader, writer, upstream_reader, upstream_writer)
        finally:
            upstream_writer.close()

    async def _vet(self, host: str, port: int) -> tuple[str | None, str]:
        """The one address to connect to (as a literal, never resolved again), or None, and why."""
        name = host.lower()
        endpoint = (name, port) in self.policy.allowed
        if not endpoint and not self.policy.internet:
            return self._record(host, port, None, NO_INTERNET)
        try:
            addresses = await self._addresses(host, port)
        except OSError as error:
            return self._record(host, port, None, f"cannot resolve: {error}")
        if not addresses:
            return self._record(host, port, None, "cannot resolve: no address")
        if name in self.policy.trusted_hosts:
            return self._record(
                host, port, str(addresses[0]), f"trusted by the operator ({variable('egress_trusted_hosts')})"
            )
        for address in addresses:
            reason = refusal(address, self._host_networks())
            if reason is not None:
                return self._record(host, port, None, reason)
        return self._record(host, port, str(addresses[0]), "the configured model endpoint" if endpoint else "public")

    async def _addresses(self, host: str, port: int) -> Sequence[IPAddress]:
        literal = literal_address(host)
        return [literal] if literal is not None else await self.resolve(host, port)

    def _host_networks(self) -> frozenset[IPNetwork]:
        if self.host_networks is None:
            self.host_networks = read_host_networks()
        return self.host_networks

    def _record(self, host: str, port: int, address: str | None, reason: str) -> tuple[str | None, str]:
        allowed = address is not None
        if len(self.attempts) < MAX_ATTEMPTS_RECORDED:
            self.attempts.append(Attempt(host, port, allowed, reason, time.time()))
        log.info("%s egress %s:%d %s (%s)", self.rollout, host, port, "allowed" if allowed else "refused", reason)
        return address, reason


@dataclass
class LoopbackRelay:
    """A model on the host's loopback (black_box mode with a local vLLM or the scripted model): the same port on
    the sandbox's loopback relays to it, and to nothing else."""

    port: int
    rollout: str
    _server: asyncio.AbstractServer | None = None

    async def serve(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        self._server = await asyncio.start_server(self._relay, sock=listener)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.port), timeout=CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as error:
            log.info("%s model relay to 127.0.0.1:%d failed: %s", self.rollout, self.port, error)
            writer.close()
            return
        try:
            await _pipe_both(reader, writer, upstream_reader, upstream_writer)
        finally:
            upstream_writer.close()
            writer.close()


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def _split_host_port(target: str, default_port: int) -> tuple[str, int]:
    if target.startswith("["):
        host, _, port = target[1:].partition("]")
        return host, _port(port.lstrip(":") or str(default_port))
    host, _, port = target.rpartition(":")
    if not host:
        return target, default_port
    return host, _port(port)


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range")
    return port


def _absolute_target(target: str) -> tuple[str, int, str]:
    if not target.startswith("http://"):
        raise ValueError("only absolute http:// targets and CONNECT are proxied")
    authority, _, path = target[len("http://") :].partition("/")
    host, port = _split_host_port(authority, 80)
    return host, port, "/" + path


async def _answer(writer: asyncio.StreamWriter, status: str, reason: str) -> None:
    body = reason.encode()
    writer.write(f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()


async def _pipe_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream_reader: asyncio.StreamReader,
    upstream_writer: asyncio.StreamWriter,
) -> None:
    directions = [
        asyncio.ensure_future(_pipe(reader, upstream_writer)),
        asyncio.ensure_future(_pipe(upstream_reader, writer)),
    ]
    try:
        await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for direction in directions:
            direction.cancel()
        await asyncio.gather(*directions, return_exceptions=True)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
