"""The capture proxy's ASGI app: chat completions go straight to the call handler (completions.py), with no
middleware between the upstream and the agent; health, drain and lifespan go to Admin. Callers are checked first:
the access token, then the socket's owner.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from opencode_env.proxy.admin import Admin
from opencode_env.proxy.asgi import Receive, Scope, Send, send_json
from opencode_env.proxy.completions import CaptureProxy
from opencode_env.proxy.settings import ProxySettings

log = logging.getLogger("opencode_env.proxy")


class ProxyApp:
    """The ASGI app: chat completions go straight to the proxy; everything else (health, drain, lifespan) to Admin."""

    def __init__(self, proxy: CaptureProxy) -> None:
        self.proxy = proxy
        self.admin = Admin(
            {("GET", "/healthz"): self._health, ("POST", "/drain"): self._drain},
            on_shutdown=proxy.aclose,
        )
        token = proxy.settings.access_token
        self._expected = f"bearer {token}".encode("latin-1") if token else b""

    async def _health(self) -> dict[str, Any]:
        trace = self.proxy.trace
        return {
            "ok": True,
            "turns_written": trace.turns_written,
            "completion_tokens_written": trace.completion_tokens_written,
            "pending": self.proxy.pending(),
        }

    async def _drain(self) -> dict[str, Any]:
        return {"turns_written": await self.proxy.drain()}

    def _authorized(self, scope: Scope) -> bool:
        """With an access token set, only the rollout's own agent (and the server) may call: anything else is 401."""
        if not self._expected:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credential = value.partition(b" ")
                return hmac.compare_digest(scheme.lower() + b" " + credential.strip(), self._expected)
        return False

    def _from_opencode(self, scope: Scope) -> bool:
        """Every TCP caller is checked; the admin's unix socket (no client address) is the server's alone."""
        peers, client = self.proxy.settings.peers, scope.get("client")
        if peers is None or client is None or peers.allowed(client, scope.get("server")):
            return True
        log.warning(
            "refused a call from %s: its socket is not OpenCode's (uids %s)",
            scope.get("client"),
            sorted(peers.allowed_uids),
        )
        return False

    def _refused(self, scope: Scope, reason: str) -> None:
        """Recorded in the trace (the result's attribution.refused_calls), never as a turn."""
        client = scope.get("client")
        self.proxy.trace.write_refused(reason, f"{client[0]}:{client[1]}" if client else "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            self._refused(scope, "no_token")
            await send_json(send, 401, {"error": {"message": "unauthorized", "type": "invalid_request_error"}})
            return
        if scope["type"] == "http" and not self._from_opencode(scope):
            self._refused(scope, "not_opencode")
            message = "only OpenCode itself may call the model"
            await send_json(send, 403, {"error": {"message": message, "type": "invalid_request_error"}})
            return
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions" and scope["method"] == "POST":
            await self.proxy(scope, receive, send)
        else:
            await self.admin(scope, receive, send)


def create_app(settings: ProxySettings) -> ProxyApp:
    return ProxyApp(CaptureProxy(settings))
