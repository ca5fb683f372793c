"""Sessions per caller, standard MCP and OpenEnv's WebSocket together: one tenant opening sessions cannot take the
server's session caps (OPENCODE_ENV_MCP_SESSIONS on each transport) from the others. The MCP SDK keeps the owner of
each open MCP session (the principal that opened it, our caller); `WebSocketSessions` counts each caller's open
WebSockets (each is one OpenEnv session). A caller's openings are admitted one at a time: each is checked against
what the caller holds, and its turn ends once its session is registered (or its request has finished), so a burst
of concurrent openings can neither slip past nor be counted twice. The operator is not counted."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from opencode_env.server.auth import Refusal
from opencode_env.server.gate import CALLER_KEY, refuse_websocket
from opencode_env.settings import variable
from opencode_env.viewer.rows import Caller

REGISTERED_POLL_S = 0.005
"""How often an opening looks for its session in the SDK's records (the SDK registers it before reading the body)."""


@dataclass
class SessionQuota:
    per_caller: int
    owners: Callable[[], Iterable[str]]
    """The caller id of each open session's owner."""
    _turns: dict[str, asyncio.Lock] = field(default_factory=dict)
    websockets: Counter[str] = field(default_factory=Counter)

    def held(self, caller_id: str) -> int:
        return sum(1 for owner in self.owners() if owner == caller_id) + self.websockets[caller_id]

    async def open_websocket(self, caller: Caller | None) -> bool:
        """Count one more WebSocket session of `caller` when it has room for it (give it back with
        `close_websocket`); False when not."""
        if caller is None or caller.operator:
            return True
        async with self._turns.setdefault(caller.id, asyncio.Lock()):
            if self.held(caller.id) >= self.per_caller:
                return False
            self.websockets[caller.id] += 1
            return True

    def close_websocket(self, caller: Caller | None) -> None:
        if caller is None or caller.operator:
            return
        self.websockets[caller.id] -= 1
        if self.websockets[caller.id] <= 0:
            del self.websockets[caller.id]

    async def open(self, caller: Caller | None, opening: Callable[[], Awaitable[None]]) -> bool:
        """Serve `opening` (a request that opens a session) when `caller` has room for one more; False when not."""
        if caller is None or caller.operator:
            await opening()
            return True
        turn = self._turns.setdefault(caller.id, asyncio.Lock())
        async with turn:
            before = self.held(caller.id)
            if before >= self.per_caller:
                return False
            served = asyncio.ensure_future(opening())
            try:
                while self.held(caller.id) <= before:
                    finished, _ = await asyncio.wait({served}, timeout=REGISTERED_POLL_S)
                    if finished:
                        break
            except BaseException:
                served.cancel()
                raise
        await served
        return True


class WebSocketSessions:
    """ASGI middleware: a WebSocket (an OpenEnv session, `/ws` or `/mcp`) is served only while its caller holds
    fewer than its share of sessions; past it, refused (503) naming the setting."""

    def __init__(self, app: ASGIApp, quota: SessionQuota) -> None:
        self.app = app
        self.quota = quota

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        caller = scope.get(CALLER_KEY)
        if not await self.quota.open_websocket(caller):
            await refuse_websocket(scope, receive, send, Refusal(503, over_quota(self.quota.per_caller)))
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.quota.close_websocket(caller)


def over_quota(per_caller: int) -> str:
    return (
        f"this caller holds {per_caller} open sessions (MCP and WebSocket), its share "
        f"({variable('mcp_sessions_per_caller')}): end one (close a WebSocket, or DELETE /mcp with its Mcp-Session-Id) "
        f"or let an MCP session idle out ({variable('mcp_session_idle_s')})"
    )
