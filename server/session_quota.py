"""Standard MCP sessions per caller: one tenant opening sessions cannot take the server's whole session cap
(OPENCODE_ENV_MCP_SESSIONS) from the others. The MCP SDK keeps the owner of each open session (the principal that
opened it, our caller). A caller's openings are admitted one at a time: each is checked against what the caller owns
there, and its turn ends once the SDK has registered its session (or its request has finished), so a burst of
concurrent openings can neither slip past nor be counted twice. The operator is not counted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from opencode_env.viewer.rows import Caller

REGISTERED_POLL_S = 0.005
"""How often an opening looks for its session in the SDK's records (the SDK registers it before reading the body)."""


@dataclass
class SessionQuota:
    per_caller: int
    owners: Callable[[], Iterable[str]]
    """The caller id of each open session's owner."""
    _turns: dict[str, asyncio.Lock] = field(default_factory=dict)

    def held(self, caller_id: str) -> int:
        return sum(1 for owner in self.owners() if owner == caller_id)

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
