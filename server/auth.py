"""Optional bearer-token auth for every route but `/health` (HTTP, the MCP endpoints and the WebSocket)."""

from __future__ import annotations

import hmac
import ipaddress
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from opencode_env.client import TOKEN_VAR
from opencode_env.viewer.web import WEB_OPEN_PATHS

ALLOW_UNAUTHENTICATED_VAR = "OPENCODE_ENV_ALLOW_UNAUTHENTICATED"
OPEN_PATHS = frozenset({"/health"}) | WEB_OPEN_PATHS


class BearerAuth:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    def _authorized(self, scope: Scope) -> bool:
        presented = dict(scope.get("headers") or []).get(b"authorization", b"")
        return hmac.compare_digest(presented, self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1008, "reason": "a valid bearer token is required"})
            return
        body = json.dumps({"error": f"missing or wrong bearer token (the server's {TOKEN_VAR})"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_unprotected_local(host: str, backend: str, token: str, allow: bool) -> str | None:
    """Why this server must not start, or None: the local backend runs commands on this machine."""
    if backend != "local" or token or allow or is_loopback(host):
        return None
    return (
        f"refusing to serve the local backend on {host} without {TOKEN_VAR}: anyone who can reach this port "
        f"could run commands on this machine. Set {TOKEN_VAR}, listen on 127.0.0.1, use the e2b backend, "
        f"or set {ALLOW_UNAUTHENTICATED_VAR}=1 if the network is trusted."
    )
