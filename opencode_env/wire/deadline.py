"""One deadline over the whole rollout; each phase gets what is left of it.

Without an explicit `total_timeout_s`, the budget is the sum of what every phase may take:
sandbox + install + proxy + collect margins, each setup and verify command's timeout, and the agent's.
"""

from __future__ import annotations

import time

from opencode_env.wire.models import RolloutRequest

SANDBOX_MARGIN_S = 120.0
INSTALL_MARGIN_S = 600.0
PROXY_MARGIN_S = 30.0
COLLECT_MARGIN_S = 60.0


class DeadlineExceeded(Exception):
    """The rollout's overall deadline passed before a phase could start."""


def total_budget_s(request: RolloutRequest) -> float:
    if request.total_timeout_s is not None:
        return request.total_timeout_s
    return (
        SANDBOX_MARGIN_S
        + INSTALL_MARGIN_S
        + PROXY_MARGIN_S
        + COLLECT_MARGIN_S
        + request.setup_timeout_s * len(request.setup)
        + request.agent_timeout_s
        + request.verify_timeout_s * len(request.verify)
    )


class Deadline:
    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self._started = time.monotonic()

    def remaining(self) -> float:
        return self.total_s - (time.monotonic() - self._started)

    def budget(self, wanted_s: float) -> float:
        """The time a phase may take: what it wants, capped by what is left; raises when nothing is left."""
        left = self.remaining()
        if left <= 0:
            raise DeadlineExceeded(f"the rollout's overall deadline of {self.total_s:.0f}s has passed")
        return min(wanted_s, left)
