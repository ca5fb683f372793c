"""How many cloud sandboxes a server may have alive at once, and how fast it may ask for new ones.

Shared by the cloud backends (E2B, Hugging Face): a slot is taken before a sandbox is created and given back when
it is closed (or its creation fails), and creations are spaced `stagger_s` apart so that a burst of rollouts does
not hit the vendor's API all in the same instant.
"""

from __future__ import annotations

import asyncio
import time

DEFAULT_LIMIT = 20
"""The default of each cloud backend's cap (OPENCODE_ENV_E2B_MAX_SANDBOXES, OPENCODE_ENV_HF_MAX_SANDBOXES)."""


class Admission:
    def __init__(self, limit: int, *, stagger_s: float) -> None:
        if limit < 1:
            raise ValueError(f"a cloud backend's cap on live sandboxes must be at least 1 (got {limit})")
        self._slots = asyncio.Semaphore(limit)
        self._stagger = asyncio.Lock()
        self._stagger_s = stagger_s
        self._last_create = 0.0

    async def acquire(self) -> None:
        """Wait for a free slot, then for this creation's turn; on cancellation no slot is held."""
        await self._slots.acquire()
        try:
            async with self._stagger:
                wait = self._last_create + self._stagger_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last_create = time.monotonic()
        except BaseException:
            self._slots.release()
            raise

    def release(self) -> None:
        self._slots.release()
