"""How many cloud sandboxes a server may have alive at once, and how fast it may ask for new ones.

Shared by the cloud backends (E2B, Hugging Face): a slot is taken before a sandbox is created and given back when
it is closed (or its creation fails), and creations are spaced `stagger_s` apart so that a burst of rollouts does
not hit the vendor's API all in the same instant.

A rollout graded in the grader's box holds one slot while its agent runs and takes a second only for verify (its
grader's VM is opened when the agent ends). Agents that will want a grader's VM ("planned") never hold every slot:
at least one stays free or held by a sandbox that ends without waiting for another (a grader's VM, a rollout graded
in its own VM), and a grader's VM is served before anything else waiting, so a rollout waiting for its grader's slot
always gets one.
"""

from __future__ import annotations

import asyncio
import time

from opencode_env.sandbox.base import GraderBoxRole
from opencode_env.sandbox.reservations import Reservations

DEFAULT_LIMIT = 20
"""The default of each cloud backend's cap (OPENCODE_ENV_E2B_MAX_SANDBOXES, OPENCODE_ENV_HF_MAX_SANDBOXES)."""


class Admission:
    """Slots, one a sandbox: graders' VMs first, then first come, first served; an agent that will want a grader's
    VM is admitted only while the others holding slots leave one for it."""

    def __init__(self, limit: int, *, stagger_s: float) -> None:
        if limit < 1:
            raise ValueError(f"a cloud backend's cap on live sandboxes must be at least 1 (got {limit})")
        self.limit = limit
        self._slots = Reservations(limit, caps={"planned": limit - 1}, first=frozenset({"this"}))
        self._stagger = asyncio.Lock()
        self._stagger_s = stagger_s
        self._last_create = 0.0

    @property
    def held(self) -> int:
        return self._slots.reserved

    async def acquire(self, role: GraderBoxRole = "none") -> None:
        """Wait for a slot `role` may take, then for this creation's turn; on cancellation no slot is held."""
        await self._slots.reserve(1, role)
        try:
            async with self._stagger:
                wait = self._last_create + self._stagger_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last_create = time.monotonic()
        except BaseException:
            self.release(role)
            raise

    def release(self, role: GraderBoxRole = "none") -> None:
        self._slots.release(1, role)
