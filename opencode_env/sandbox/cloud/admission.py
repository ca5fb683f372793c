"""How many cloud sandboxes a server may have alive at once, and how fast it may ask for new ones.

Shared by the cloud backends (E2B, Hugging Face): a slot is taken before a sandbox is created and given back when
it is closed (or its creation fails), and creations are spaced `stagger_s` apart so that a burst of rollouts does
not hit the vendor's API all in the same instant.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

DEFAULT_LIMIT = 20
"""The default of each cloud backend's cap (OPENCODE_ENV_E2B_MAX_SANDBOXES, OPENCODE_ENV_HF_MAX_SANDBOXES)."""


class Admission:
    """Slots, taken first come, first served: a request for two (a rollout's VM and its grader's) is never passed
    over by later ones for one, and never holds one slot while it waits for the second."""

    def __init__(self, limit: int, *, stagger_s: float) -> None:
        if limit < 1:
            raise ValueError(f"a cloud backend's cap on live sandboxes must be at least 1 (got {limit})")
        self.limit = limit
        self._free = limit
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._stagger = asyncio.Lock()
        self._stagger_s = stagger_s
        self._last_create = 0.0

    async def acquire(self, slots: int = 1) -> None:
        """Wait for `slots` free slots at once (at most the cap), then for this creation's turn; on cancellation no
        slot is held."""
        slots = min(slots, self.limit)
        if not self._waiting and self._free >= slots:
            self._free -= slots
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (slots, turn)
            self._waiting.append(entry)
            try:
                await turn
            except asyncio.CancelledError:
                if entry in self._waiting:
                    self._waiting.remove(entry)
                    self._wake()
                elif turn.done() and not turn.cancelled():
                    self.release(slots)
                raise
        try:
            async with self._stagger:
                wait = self._last_create + self._stagger_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last_create = time.monotonic()
        except BaseException:
            self.release(slots)
            raise

    def release(self, slots: int = 1) -> None:
        self._free += min(slots, self.limit)
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self._free >= self._waiting[0][0]:
            slots, turn = self._waiting.popleft()
            if turn.done():
                continue
            self._free -= slots
            turn.set_result(None)
