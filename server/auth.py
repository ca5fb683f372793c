"""Who may use this server, decided per request for every route but `/health` (HTTP, MCP and WebSocket).

With a token (OPENCODE_ENV_TOKEN), every request must carry it as a bearer token. Without one, only connections
from this machine are served (every backend runs commands or spends the owner's money for whoever reaches it),
unless OPENCODE_ENV_ALLOW_UNAUTHENTICATED=1 says the network is trusted. The rule lives in the app itself, so
`uvicorn opencode_env.server.app:app --host 0.0.0.0` obeys it too, and the server always starts and explains itself.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass

from opencode_env.settings import variable
from opencode_env.viewer.web import WEB_OPEN_PATHS

OPEN_PATHS = frozenset({"/health"}) | WEB_OPEN_PATHS
# A request relayed by a proxy may come from anywhere, whatever the address of the hop that relayed it.
FORWARDING_HEADERS = frozenset({b"forwarded", b"x-forwarded-for", b"x-real-ip"})


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str


@dataclass(frozen=True)
class AccessPolicy:
    token: str
    allow_unauthenticated: bool
    risk: str
    """What the backend does for whoever reaches the server (the sandbox registry's words)."""

    def check(self, headers: list[tuple[bytes, bytes]], client_host: str | None) -> Refusal | None:
        """Why this request may not proceed, or None."""
        if self.token:
            return self._check_token(headers)
        if self.allow_unauthenticated or (is_loopback(client_host) and not _forwarded(headers)):
            return None
        return Refusal(
            403,
            f"this server {self.risk} for anyone who reaches it, and it has no access token: set "
            f"{variable('token')} on the server and send it as `Authorization: Bearer <token>`, or set "
            f"{variable('allow_unauthenticated')}=1 if the network is trusted (connections from the server's own "
            "machine are served without a token)",
        )

    def _check_token(self, headers: list[tuple[bytes, bytes]]) -> Refusal | None:
        presented = next((value for name, value in headers if name.lower() == b"authorization"), None)
        if presented is None:
            return Refusal(
                401, f"this server needs its access token: send `Authorization: Bearer <{variable('token')}>`"
            )
        scheme, _, credentials = presented.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return Refusal(
                401, f"the Authorization header must use the Bearer scheme with the server's {variable('token')}"
            )
        if not hmac.compare_digest(credentials.strip(), self.token.encode()):
            return Refusal(401, f"the bearer token does not match the server's {variable('token')}")
        return None


def _forwarded(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() in FORWARDING_HEADERS for name, _ in headers)


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
