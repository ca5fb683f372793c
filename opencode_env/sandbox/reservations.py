"""Units (a cloud backend's sandbox slots, the local backend's MiB of memory) reserved against a capacity, in turn: a
request is never passed over by later ones of its rank, holds nothing while it waits, and holds nothing once it is
cancelled, even when its turn came in the same instant.

A reservation may carry a kind: a kind may have a cap of its own below the capacity, and kinds named `first` are
served before every other waiter (the cloud's grader VMs, which an agent already holding a slot waits for)."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Hashable, Mapping


class Reservations:
    """`reserve` takes the units at once when nobody waits and they fit, else waits its turn; `release`
    (synchronous, callable from a close hook) hands freed room to the waiters: the `first` kinds in order, then the
    rest in order."""

    def __init__(
        self, capacity: int, *, caps: Mapping[Hashable, int] | None = None, first: frozenset[Hashable] = frozenset()
    ) -> None:
        self.capacity = capacity
        self.reserved = 0
        self._caps = dict(caps or {})
        self._first = first
        self._held: Counter[Hashable] = Counter()
        self._waiting: deque[tuple[int, Hashable, asyncio.Future[None]]] = deque()

    async def reserve(self, units: int, kind: Hashable = None) -> None:
        if not self._waiting and self._fits(units, kind):
            self._take(units, kind)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (units, kind, turn)
        self._waiting.append(entry)
        self._wake()
        try:
            await turn
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
                self._wake()
            elif turn.done() and not turn.cancelled():
                self.release(units, kind)
            raise

    def release(self, units: int, kind: Hashable = None) -> None:
        self.reserved -= units
        self._held[kind] -= units
        self._wake()

    def _fits(self, units: int, kind: Hashable) -> bool:
        cap = self._caps.get(kind)
        return self.reserved + units <= self.capacity and (cap is None or self._held[kind] + units <= cap)

    def _take(self, units: int, kind: Hashable) -> None:
        self.reserved += units
        self._held[kind] += units

    def _wake(self) -> None:
        for entry in [entry for entry in self._waiting if entry[1] in self._first]:
            if not self._fits(entry[0], entry[1]):
                break
            self._grant(entry)
        while self._waiting and self._fits(self._waiting[0][0], self._waiting[0][1]):
            self._grant(self._waiting[0])

    def _grant(self, entry: tuple[int, Hashable, asyncio.Future[None]]) -> None:
        self._waiting.remove(entry)
        units, kind, turn = entry
        if not turn.done():
            self._take(units, kind)
            turn.set_result(None)
