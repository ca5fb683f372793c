"""The server's rollout slots, shared fairly among its callers.

Each rollout call enters with a `Ticket` (refused at once, `OverShare`, when its caller already has its share of
calls waiting) and waits for a slot. A freed slot goes to the waiting caller that holds the fewest slots (among
equals, the one whose call has waited longest), never to a caller at its own cap: a caller alone can use every slot,
and once another waits, every slot that frees goes to whoever holds less until they hold the same. Nothing running is
stopped: a caller that took every slot while alone gives them up as its rollouts end. The operator is served in the
same order, but no cap counts its calls.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field

from opencode_env.settings import variable


class OverShare(Exception):
    """A caller's call goes past its share of the server (its message names the setting)."""


@dataclass(eq=False)
class Ticket:
    """One rollout call's place: waiting, then holding a slot, then gone (`leave`, any number of times)."""

    slots: FairSlots
    caller: str
    capped: bool
    order: int
    granted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    left: bool = False
    handed_on: bool = False
    """A rollout took it over: it leaves when that rollout ends, whoever waits for it."""

    async def acquire(self) -> None:
        """Until this call holds a slot; cancelled, it holds none (and is no longer waiting)."""
        try:
            await asyncio.shield(self.granted)
        except asyncio.CancelledError:
            self.leave()
            raise

    def leave(self) -> None:
        if not self.left:
            self.left = True
            self.slots._leave(self)


class FairSlots:
    def __init__(self, limit: int, *, per_caller: int = 0, queued_per_caller: int | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the rollout slots must be at least 1, got {limit}")
        self.limit = limit
        self.per_caller = min(per_caller or limit, limit)
        """Slots one (capped) caller may hold at once."""
        self.queued_per_caller = queued_per_caller
        """Calls one (capped) caller may have waiting; None: no bound."""
        self.held: Counter[str] = Counter()
        self._waiting: dict[str, list[Ticket]] = {}
        self._order = itertools.count()

    @property
    def free(self) -> int:
        return self.limit - sum(self.held.values())

    def waiting(self, caller: str) -> int:
        return len(self._waiting.get(caller, ()))

    def enter(self, caller: str, *, capped: bool = True) -> Ticket:
        """A call of `caller` joins the queue (and holds a slot at once when one is free and it is its turn);
        OverShare when a capped caller already has `queued_per_caller` calls waiting."""
        if capped:
            self.check_room(caller)
        ticket = Ticket(self, caller, capped, next(self._order))
        self._waiting.setdefault(caller, []).append(ticket)
        self._wake()
        return ticket

    def check_room(self, caller: str) -> None:
        """OverShare when `caller` already has `queued_per_caller` calls waiting."""
        queued = self.waiting(caller)
        if self.queued_per_caller is not None and queued >= self.queued_per_caller:
            raise OverShare(
                f"this caller has {queued} rollout calls waiting for a slot, its share "
                f"({variable('queued_per_caller')}): wait for some to start"
            )

    def _leave(self, ticket: Ticket) -> None:
        queue = self._waiting.get(ticket.caller, [])
        if ticket in queue:
            queue.remove(ticket)
            if not queue:
                del self._waiting[ticket.caller]
        elif ticket.granted.done() and not ticket.granted.cancelled():
            self.held[ticket.caller] -= 1
            if self.held[ticket.caller] <= 0:
                del self.held[ticket.caller]
        if not ticket.granted.done():
            ticket.granted.cancel()
        self._wake()

    def _wake(self) -> None:
        while self.free > 0:
            ticket = self._next()
            if ticket is None:
                return
            queue = self._waiting[ticket.caller]
            queue.pop(0)
            if not queue:
                del self._waiting[ticket.caller]
            self.held[ticket.caller] += 1
            ticket.granted.set_result(None)

    def _next(self) -> Ticket | None:
        """The first waiting call of the caller holding the fewest slots (not at its cap), the longest waiting first
        among equals."""
        eligible = [
            queue[0]
            for caller, queue in self._waiting.items()
            if not queue[0].capped or self.held[caller] < self.per_caller
        ]
        return min(eligible, key=lambda ticket: (self.held[ticket.caller], ticket.order), default=None)
