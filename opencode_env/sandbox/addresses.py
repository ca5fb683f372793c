"""Which addresses a connection we make for a sandbox or a caller may go to: a judgement by address class.

`ipaddress.is_global` alone is not enough: depending on the Python version it calls NAT64, 6to4, IPv4-compatible
and mapped forms, multicast, site-local and unassigned IPv6 space global, and it knows nothing of this machine's
own addresses (a public address of the host reaches the host's own services). So an address is refused when it is
one of this machine's, when an IPv4 address embedded in it would be refused, when its range is named below, when
it is IPv6 outside global unicast (2000::/3), or when `is_global` says so.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from pathlib import Path
from typing import Any

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

ALWAYS_LOCAL: frozenset[IPNetwork] = frozenset(
    ip_network(network) for network in ("0.0.0.0/8", "127.0.0.0/8", "::/128", "::1/128")
)
"""Reach this machine whatever its interfaces: loopback, and the unspecified address a connect() maps to it."""

REFUSED_RANGES: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ip_network(network), description)
    for network, description in (
        ("0.0.0.0/8", "'this network', which reaches this machine"),
        ("10.0.0.0/8", "a private address (RFC 1918)"),
        ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local, where the cloud metadata service lives"),
        ("172.16.0.0/12", "a private address (RFC 1918)"),
        ("192.0.0.0/24", "reserved for IETF protocol assignments"),
        ("192.0.2.0/24", "documentation (TEST-NET-1)"),
        ("192.88.99.0/24", "the deprecated 6to4 relay anycast"),
        ("192.168.0.0/16", "a private address (RFC 1918)"),
        ("198.18.0.0/15", "reserved for benchmarking"),
        ("198.51.100.0/24", "documentation (TEST-NET-2)"),
        ("203.0.113.0/24", "documentation (TEST-NET-3)"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved (the limited broadcast address included)"),
        ("::/128", "the unspecified address, which reaches this machine"),
        ("::1/128", "loopback"),
        ("::ffff:0:0/96", "an IPv4-mapped address"),
        ("::/96", "an IPv4-compatible address (deprecated)"),
        ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)"),
        ("100::/64", "discard-only"),
        ("2001::/32", "Teredo"),
        ("2001::/23", "reserved for IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4 (deprecated)"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "an SRv6 segment identifier"),
        ("fc00::/7", "a unique local (private) address"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
    )
)
"""Ranges refused whatever `is_global` says in this Python; the first match names the reason."""

GLOBAL_UNICAST = IPv6Network("2000::/3")
NAT64_WELL_KNOWN = IPv6Network("64:ff9b::/96")
"""Outside 2000::/3 but public: DNS64 on an IPv6-only host answers with it; its embedded IPv4 address decides."""
NAT64_LOCAL_USE = IPv6Network("64:ff9b:1::/48")
IPV4_MAPPED = IPv6Network("::ffff:0:0/96")
IPV4_COMPATIBLE = IPv6Network("::/96")


def refusal(address: IPAddress, host_networks: frozenset[IPNetwork]) -> str | None:
    """Why the egress proxy must not connect to `address`, or None when it may."""
    if within(address, host_networks | ALWAYS_LOCAL):
        return f"{address} is an address of this machine"
    for embedded, form in embedded_ipv4(address):
        inner = refusal(embedded, host_networks)
        if inner is not None:
            return f"{address} embeds {embedded} ({form}): {inner}"
    description = class_refusal(address)
    return None if description is None else f"{address} is {description}"


def class_refusal(address: IPAddress) -> str | None:
    """What makes the address's class unfit for egress, or None for a public unicast address."""
    for network, description in REFUSED_RANGES:
        if contains(network, address):
            return description
    if isinstance(address, IPv6Address) and address not in GLOBAL_UNICAST and address not in NAT64_WELL_KNOWN:
        return "outside IPv6 global unicast (2000::/3)"
    if not address.is_global:
        return "not a public address"
    return None


def embedded_ipv4(address: IPAddress) -> Iterator[tuple[IPv4Address, str]]:
    """Each IPv4 address an IPv6 address carries in a form some router or tunnel may deliver to.

    Local-use NAT64 is read in its /96 layout (the IPv4 address last); its class is refused in any layout.
    """
    if isinstance(address, IPv4Address):
        return
    if address in IPV4_MAPPED:
        yield IPv4Address(int(address) & 0xFFFFFFFF), "IPv4-mapped"
    elif address in IPV4_COMPATIBLE and int(address) > 1:
        yield IPv4Address(int(address) & 0xFFFFFFFF), "IPv4-compatible"
    elif address in NAT64_WELL_KNOWN or address in NAT64_LOCAL_USE:
        yield IPv4Address(int(address) & 0xFFFFFFFF), "NAT64"
    if address.sixtofour is not None:
        yield address.sixtofour, "6to4"
    if address.teredo is not None:
        server, client = address.teredo
        yield server, "Teredo server"
        yield client, "Teredo client"


def within(address: IPAddress, networks: frozenset[IPNetwork]) -> bool:
    return any(contains(network, address) for network in networks)


def contains(network: IPNetwork, address: IPAddress) -> bool:
    return network.version == address.version and address in network


def local_ipv4_networks(fib_trie: str) -> frozenset[IPNetwork]:
    """The LOCAL routes in /proc/net/fib_trie: every IPv4 address (and loopback range) of this machine."""
    networks: set[IPNetwork] = set()
    leaf = ""
    for line in fib_trie.splitlines():
        fields = line.split()
        if fields[:1] == ["|--"] and len(fields) == 2:
            leaf = fields[1]
        elif fields and fields[0].startswith("/") and fields[-1] == "LOCAL" and leaf:
            networks.add(ip_network(f"{leaf}{fields[0]}", strict=False))
    return frozenset(networks)


def local_ipv6_networks(if_inet6: str) -> frozenset[IPNetwork]:
    """Every address in /proc/net/if_inet6 (one per line, 32 hex digits first), each as a /128."""
    return frozenset(
        IPv6Network(IPv6Address(int(line.split()[0], 16))) for line in if_inet6.splitlines() if line.strip()
    )


FIB_TRIE = Path("/proc/self/net/fib_trie")
IF_INET6 = Path("/proc/self/net/if_inet6")


def read_host_networks() -> frozenset[IPNetwork]:
    """This machine's own addresses in the server's network namespace, the one the proxy connects from."""
    try:
        ipv6 = IF_INET6.read_text()
    except FileNotFoundError:
        ipv6 = ""  # IPv6 is disabled in this kernel: the machine has no IPv6 address
    return ALWAYS_LOCAL | local_ipv4_networks(FIB_TRIE.read_text()) | local_ipv6_networks(ipv6)


def resolved_addresses(infos: list[tuple[Any, ...]]) -> list[IPAddress]:
    """The addresses of `getaddrinfo`'s answer (an IPv6 zone index dropped)."""
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
