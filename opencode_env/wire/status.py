"""How a rollout ended: its status, the phase that failed, where the reward came from, the limits enforced."""

from __future__ import annotations

from typing import Literal

Phase = Literal["validate", "sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect"]
RolloutStatus = Literal[
    "completed",
    "setup_failed",
    "agent_timeout",
    "agent_error",
    "sandbox_error",
    "install_error",
    "proxy_error",
    "upstream_error",
    "invalid_request",
    "timeout",
    "cancelled",
    "internal_error",
]
INFRASTRUCTURE_FAILURES: frozenset[RolloutStatus] = frozenset(
    {"sandbox_error", "install_error", "proxy_error", "upstream_error", "timeout", "cancelled", "internal_error"}
)
"""Statuses where our side (sandbox, install, proxy, model endpoint, deadline) failed: such a rollout carries no
reward and gives no usable training data. `invalid_request` never ran; `setup_failed`, `agent_error` and
`agent_timeout` are outcomes of the task or the policy."""


def is_infrastructure_failure(status: RolloutStatus) -> bool:
    """The one predicate that decides whether a rollout's reward and training data can be used."""
    return status in INFRASTRUCTURE_FAILURES


RewardSource = Literal["reward_json", "reward_txt", "verify_pass_rate", "tests", "none"]
LimitHit = Literal["memory", "processes", "disk"]
