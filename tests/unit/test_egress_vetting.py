"""The egress proxy's vetting: by address class, before any name lookup under model_only, and on the address it
connects to. End-to-end tests reach loopback listeners only; names are answered by an injected resolver, so no
test sends a packet (a DNS query included) to anything outside this machine."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, ip_address, ip_network

import pytest

from opencode_env.sandbox.addresses import (
    IPAddress,
    IPNetwork,
    local_ipv4_networks,
    local_ipv6_networks,
    read_host_networks,
    refusal,
)
from opencode_env.sandbox.local.isolation.egress import EgressPolicy, EgressProxy, parse_trusted_hosts

HOST_V4 = "81.2.69.160"
HOST_V6 = "2a01:4f8:c17:1::1"
HOST_NETWORKS: frozenset[IPNetwork] = frozenset({ip_network(HOST_V4), ip_network(HOST_V6)})
"""Stand-ins for a public address on one of this machine's interfaces."""


def teredo(server: str, client: str, port: int = 40000) -> str:
    """A Teredo address (RFC 4380): prefix, server, flags, then the client's port and address, both inverted."""
    bits = (0x2001_0000 << 96) | (int(IPv4Address(server)) << 64) | (0x8000 << 48)
    return str(ip_address(bits | ((port ^ 0xFFFF) << 32) | (int(IPv4Address(client)) ^ 0xFFFFFFFF)))


REFUSED = [
    ("64:ff9b::a9fe:a9fe", "embeds 169.254.169.254 (NAT64)"),
    ("64:ff9b:1::a9fe:a9fe", "embeds 169.254.169.254 (NAT64)"),
    ("64:ff9b::a00:1", "embeds 10.0.0.1 (NAT64)"),
    ("64:ff9b:1::808:808", "local-use NAT64"),
    ("2002:a9fe:a9fe::1", "embeds 169.254.169.254 (6to4)"),
    ("2002:a00:1::1", "embeds 10.0.0.1 (6to4)"),
    ("2002:808:808::1", "6to4 (deprecated)"),
    (teredo("65.54.227.120", "10.0.0.1"), "embeds 10.0.0.1 (Teredo client)"),
    (teredo("192.168.1.1", "8.8.8.8"), "embeds 192.168.1.1 (Teredo server)"),
    (teredo("65.54.227.120", "8.8.8.8"), "is Teredo"),
    ("::ffff:169.254.169.254", "embeds 169.254.169.254 (IPv4-mapped)"),
    ("::ffff:127.0.0.1", "embeds 127.0.0.1 (IPv4-mapped): 127.0.0.1 is an address of this machine"),
    ("::ffff:8.8.8.8", "IPv4-mapped address"),
    ("::10.0.0.1", "embeds 10.0.0.1 (IPv4-compatible)"),
    ("::8.8.8.8", "IPv4-compatible address"),
    (HOST_V4, "is an address of this machine"),
    (HOST_V6, "is an address of this machine"),
    (f"::ffff:{HOST_V4}", "is an address of this machine"),
    ("64:ff9b::5102:45a0", "embeds 81.2.69.160 (NAT64): 81.2.69.160 is an address of this machine"),
    ("127.0.0.1", "is an address of this machine"),
    ("127.8.8.8", "is an address of this machine"),
    ("::1", "is an address of this machine"),
    ("0.0.0.0", "is an address of this machine"),
    ("::", "is an address of this machine"),
    ("169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "shared address space"),
    ("fd00::1", "unique local"),
    ("fec0::1", "site-local"),
    ("224.0.0.251", "multicast"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("192.0.0.9", "IETF protocol assignments"),
    ("192.88.99.1", "6to4 relay anycast"),
    ("198.18.0.1", "benchmarking"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.1", "documentation"),
    ("203.0.113.1", "documentation"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation"),
    ("100::1", "discard-only"),
    ("5f00::1", "SRv6"),
    ("4000::1", "outside IPv6 global unicast"),
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2001:4860:4860::8888", "64:ff9b::808:808"]
IS_GLOBAL_ACCEPTED = [
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::a9fe:a9fe",
    "2002:a9fe:a9fe::1",
    "2002:a00:1::1",
    "::10.0.0.1",
    "ff0e::1",
    "224.0.0.251",
    "fec0::1",
    "192.88.99.1",
]
"""Literals today's `is_global` check let through (Python 3.11; newer versions refuse some of them)."""


@pytest.mark.parametrize(("address", "reason"), REFUSED)
def test_refusal_names_why_an_address_is_refused(address: str, reason: str) -> None:
    assert reason in (refusal(ip_address(address), HOST_NETWORKS) or "")


@pytest.mark.parametrize("address", PUBLIC)
def test_public_unicast_addresses_pass(address: str) -> None:
    assert refusal(ip_address(address), HOST_NETWORKS) is None


def test_this_machines_addresses_are_read_from_the_kernel() -> None:
    networks = read_host_networks()
    assert ip_network("127.0.0.0/8") in networks
    assert ip_network("::1/128") in networks
    assert ip_network("0.0.0.0/8") in networks


def test_local_routes_and_ipv6_addresses_are_parsed() -> None:
    fib_trie = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     |-- 81.2.69.0
        /24 link UNICAST
     |-- 81.2.69.160
        /32 host LOCAL
"""
    if_inet6 = (
        "2a0104f80c1700010000000000000001 02 40 00 00     eth0\n00000000000000000000000000000001 01 80 10 80       lo\n"
    )
    assert local_ipv4_networks(fib_trie) == {ip_network("127.0.0.0/8"), ip_network("127.0.0.1/32"), ip_network(HOST_V4)}
    assert local_ipv6_networks(if_inet6) == {ip_network(HOST_V6), ip_network("::1/128")}


@pytest.mark.parametrize("address", IS_GLOBAL_ACCEPTED)
async def test_the_proxy_refuses_literals_that_is_global_accepts(address: str) -> None:
    proxy = EgressProxy(EgressPolicy(internet=True), rollout="unit")
    assert (await proxy._vet(address, 443))[0] is None


async def test_an_allowed_endpoint_is_vetted_by_class_under_model_only() -> None:
    proxy = EgressProxy(EgressPolicy(internet=False, allowed=frozenset({("169.254.169.254", 80)})), rollout="unit")
    assert (await proxy._vet("169.254.169.254", 80))[0] is None


@dataclass
class Resolver:
    """Answers names from a table and counts the questions; a name outside the table is an error."""

    answers: dict[str, list[str]]
    asked: list[str] = field(default_factory=list)

    async def __call__(self, host: str, port: int) -> Sequence[IPAddress]:
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the test's table")
        return [ip_address(address) for address in self.answers[host]]


async def test_a_name_is_refused_when_any_of_its_addresses_is() -> None:
    resolver = Resolver({"mixed.test": ["8.8.8.8", "64:ff9b::a9fe:a9fe"]})
    proxy = EgressProxy(EgressPolicy(internet=True), rollout="unit", resolve=resolver, host_networks=HOST_NETWORKS)
    address, reason = await proxy._vet("mixed.test", 443)
    assert address is None
    assert "embeds 169.254.169.254" in reason


async def test_this_machines_public_address_is_refused_by_name_and_literal() -> None:
    resolver = Resolver({"self.test": [HOST_V4]})
    proxy = EgressProxy(EgressPolicy(internet=True), rollout="unit", resolve=resolver, host_networks=HOST_NETWORKS)
    assert (await proxy._vet("self.test", 443))[0] is None
    assert (await proxy._vet(HOST_V6, 443))[0] is None
    assert resolver.asked == ["self.test"]


async def test_an_allowed_endpoint_with_internet_is_vetted_unless_trusted() -> None:
    resolver = Resolver({"model.test": ["169.254.169.254"]})
    allowed = frozenset({("model.test", 8000)})
    plain = EgressProxy(EgressPolicy(internet=True, allowed=allowed), rollout="unit", resolve=resolver)
    trusted = EgressProxy(
        EgressPolicy(internet=True, allowed=allowed, trusted_hosts=frozenset({"model.test"})),
        rollout="unit",
        resolve=resolver,
    )
    assert (await plain._vet("model.test", 8000))[0] is None
    assert (await trusted._vet("model.test", 8000))[0] == "169.254.169.254"


@dataclass
class Listener:
    """A loopback TCP server that greets each connection and counts them."""

    server: asyncio.Server
    greeting: bytes
    connections: int = 0

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])


async def listen(host: str, greeting: bytes, port: int = 0) -> Listener:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        listener.connections += 1
        writer.write(greeting)
        await writer.drain()
        writer.close()

    listener = Listener(await asyncio.start_server(greet, host, port), greeting)
    return listener


@pytest.fixture
async def target() -> AsyncIterator[Listener]:
    listener = await listen("127.0.0.2", b"target\n")
    try:
        yield listener
    finally:
        listener.server.close()
        await listener.server.wait_closed()


async def through(proxy: EgressProxy, request: str) -> bytes:
    """Serve `proxy` on loopback, send one request through it and read everything it answers."""
    await proxy.serve(socket.create_server(("127.0.0.1", 0)))
    assert proxy._server is not None
    port = proxy._server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request.encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
        return answer
    finally:
        await proxy.close()


@pytest.mark.parametrize(
    "request_line",
    ["CONNECT pypi.org:443 HTTP/1.1", "GET http://pypi.org/simple/ HTTP/1.1", "CONNECT model:9 HTTP/1.1"],
)
async def test_model_only_refuses_before_any_name_lookup(request_line: str) -> None:
    resolver = Resolver({"pypi.org": ["151.101.0.223"], "model": ["151.101.0.223"]})
    policy = EgressPolicy(internet=False, allowed=frozenset({("model", 8000)}), trusted_hosts=frozenset({"pypi.org"}))
    proxy = EgressProxy(policy, rollout="unit", resolve=resolver)
    answer = await through(proxy, f"{request_line}\r\nhost: pypi.org\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403")
    assert b"no internet access" in answer
    assert resolver.asked == []


async def test_model_only_refuses_an_allowed_endpoint_on_loopback(target: Listener) -> None:
    policy = EgressPolicy(internet=False, allowed=frozenset({("127.0.0.2", target.port)}))
    answer = await through(EgressProxy(policy, rollout="unit"), f"CONNECT 127.0.0.2:{target.port} HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403")
    assert target.connections == 0


async def test_a_trusted_endpoint_is_reached_at_the_address_it_resolved_to(target: Listener) -> None:
    decoy = await listen("127.0.0.1", b"decoy\n", target.port)
    resolver = Resolver({"localhost": ["127.0.0.2"]})
    policy = EgressPolicy(
        internet=False, allowed=frozenset({("localhost", target.port)}), trusted_hosts=frozenset({"localhost"})
    )
    try:
        answer = await through(
            EgressProxy(policy, rollout="unit", resolve=resolver), f"CONNECT localhost:{target.port} HTTP/1.1\r\n\r\n"
        )
    finally:
        decoy.server.close()
        await decoy.server.wait_closed()
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\ntarget\n"
    assert resolver.asked == ["localhost"]
    assert (target.connections, decoy.connections) == (1, 0)


def test_the_operators_trusted_hosts_are_names_in_a_list() -> None:
    assert parse_trusted_hosts(" Mirror.Test, ,pypi.org,") == frozenset({"mirror.test", "pypi.org"})
    assert parse_trusted_hosts("") == frozenset()


async def test_an_absolute_uri_goes_to_a_trusted_host_with_its_path(target: Listener) -> None:
    resolver = Resolver({"mirror.test": ["127.0.0.2"]})
    policy = EgressPolicy(internet=True, trusted_hosts=frozenset({"mirror.test"}))
    answer = await through(
        EgressProxy(policy, rollout="unit", resolve=resolver),
        f"GET http://mirror.test:{target.port}/simple/ HTTP/1.1\r\nhost: mirror.test\r\n\r\n",
    )
    assert answer == b"target\n"
    assert target.connections == 1


async def test_an_unreachable_vetted_address_is_a_bad_gateway() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    policy = EgressPolicy(internet=True, trusted_hosts=frozenset({"127.0.0.1"}))
    answer = await through(EgressProxy(policy, rollout="unit"), f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 502")
