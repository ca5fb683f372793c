"""Who may point the capture proxy where: a caller's URL is not a network primitive.

URLs the operator configured (the server's environment, the endpoint catalog's defaults) are trusted as they are.
A base URL a caller sends to a server is checked: its host must be on the operator's allow-list
(`OPENCODE_ENV_UPSTREAM_ALLOW`: hosts, host:port pairs or networks, comma-separated), or every address it resolves
to must be public and none of this machine's; the server's own ports (every port it is reached on, and the one it was
configured with) are never a target. A server that serves only
callers on its own machine (no token) allows loopback when no list is set: such a caller reaches loopback anyway.
In-process (the library, run by the operator) there is no caller to distrust and nothing is checked.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opencode_env.rollout.endpoints import EndpointError
from opencode_env.sandbox.addresses import (
    IPAddress,
    IPNetwork,
    literal_address,
    read_host_networks,
    refusal,
    resolved_addresses,
    within,
)
from opencode_env.settings import variable
from opencode_env.wire import RolloutRequest

Resolver = Callable[[str, int], Sequence[IPAddress]]


class UpstreamRefused(EndpointError):
    """The caller's base URL points where the operator did not allow (the message names the rule and the fix)."""


def system_resolver(host: str, port: int) -> list[IPAddress]:
    return resolved_addresses(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))


@dataclass(frozen=True)
class AllowList:
    hosts: frozenset[str] = frozenset()
    host_ports: frozenset[tuple[str, int]] = frozenset()
    networks: frozenset[IPNetwork] = frozenset()

    @classmethod
    def parse(cls, text: str) -> AllowList:
        hosts, host_ports, networks = set(), set(), set()
        for entry in (part.strip().lower() for part in text.split(",")):
            if not entry:
                continue
            try:
                networks.add(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            host, _, port = entry.rpartition(":")
            if host and port.isdigit() and not host.endswith(":"):
                host_ports.add((host.strip("[]"), int(port)))
            else:
                hosts.add(entry.strip("[]"))
        return cls(frozenset(hosts), frozenset(host_ports), frozenset(networks))

    def admits(self, host: str, port: int, addresses: Sequence[IPAddress]) -> bool:
        if host in self.hosts or (host, port) in self.host_ports:
            return True
        return bool(addresses) and all(any(a in network for network in self.networks) for a in addresses)


LOOPBACK = AllowList(
    hosts=frozenset({"localhost"}),
    networks=frozenset({ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1")}),
)


@dataclass(frozen=True)
class UpstreamPolicy:
    allowed: AllowList = field(default_factory=AllowList)
    own_ports: Callable[[], frozenset[int]] = frozenset
    """The server's own ports at the time of a check (it may listen on more than it was configured with)."""
    resolve: Resolver = system_resolver
    host_networks: Callable[[], frozenset[IPNetwork]] = read_host_networks

    @classmethod
    def configured(
        cls, allow: str, own_ports: Callable[[], frozenset[int]], *, callers_are_local: bool = False
    ) -> UpstreamPolicy:
        """The operator's allow-list (OPENCODE_ENV_UPSTREAM_ALLOW's text); with none, loopback too when every
        caller is on this machine."""
        allowed = AllowList.parse(allow) if allow or not callers_are_local else LOOPBACK
        return cls(allowed=allowed, own_ports=own_ports)

    def check(self, base_url: str) -> str:
        """The address the proxy must connect to for `base_url`, the one vetted here (no second resolution, so a
        name cannot rebind between the check and the connection); raises UpstreamRefused unless a caller may."""
        parsed = urlsplit(base_url)
        host = (parsed.hostname or "").lower()
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        literal = literal_address(host)
        try:
            addresses = [literal] if literal is not None else list(self.resolve(host, port))
        except OSError as error:
            raise UpstreamRefused(f"base_url: cannot resolve {host!r}: {error}") from error
        local = self.host_networks()
        if port in self.own_ports() and any(within(a, local) for a in addresses):
            raise UpstreamRefused(f"base_url: {host}:{port} is this server itself, never a model endpoint")
        if not self.allowed.admits(host, port, addresses):
            for address in addresses:
                why = refusal(address, local)
                if why is not None:
                    raise UpstreamRefused(
                        f"base_url: {host} is refused ({why}); a caller may name only public model endpoints "
                        f"unless the operator allows this one in {variable('upstream_allow')}"
                    )
        if not addresses:
            raise UpstreamRefused(f"base_url: {host} resolves to no address")
        return str(addresses[0])


def key_custody_problem(request: RolloutRequest, *, key_from_server: bool, proxy_beside_task_root: bool) -> str | None:
    """Why a key from the server's environment must not go into this rollout's sandbox, or None.

    On a backend whose capture proxy shares a VM with the task's root (E2B, Hugging Face), root in that VM can read
    the proxy's memory or replace the interpreter it runs: a caller whose setup runs as root, or who names the
    image, could take the operator's key. The caller's own key is theirs to risk."""
    if not key_from_server or not proxy_beside_task_root:
        return None
    chosen = [
        name
        for name, chosen in (
            ("setup_as='root' with setup commands", request.setup_as == "root" and bool(request.setup)),
            ("image", bool(request.image)),
            ("template", bool(request.template)),
        )
        if chosen
    ]
    if not chosen:
        return None
    return (
        f"{', '.join(chosen)}: on this backend the capture proxy shares the sandbox's VM with its root, so the "
        "server's model key is never sent where code or an image the caller chose runs as root; use "
        "setup_as='user' and the backend's default image, or send your own api_key"
    )
