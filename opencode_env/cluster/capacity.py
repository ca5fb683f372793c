"""What a node offers the cluster: rollout slots computed from its own capacity, advertised to Ray as a custom
resource (`ray start --resources '{"opencode_env_slots": N}'`) and read back by the driver to size each node's
runner. Pure arithmetic over the local backend's own figures, so a slot means what the local backend would admit."""

from __future__ import annotations

import json
import os

from pydantic import BaseModel, Field

from opencode_env.sandbox.base import ResourceLimits
from opencode_env.sandbox.local.services import DEFAULT_OVERCOMMIT, PROXY_LIMITS, memory_budget_mb

SLOT_RESOURCE = "opencode_env_slots"
"""The custom resource a node advertises: how many rollouts it runs at once. Only nodes advertising it get a runner."""
ROLLOUTS_PER_CPU = 2


class NodeCapacity(BaseModel):
    """A node's slots and what they were computed from."""

    slots: int = Field(ge=0)
    memory_budget_mb: int
    rollout_memory_mb: int = Field(description="One rollout's memory limit plus its proxy's, as admission counts it.")
    cpus: int


def rollout_memory_mb(limits: ResourceLimits | None = None) -> int:
    """What the local backend's admission reserves for one rollout of these limits (default: a request's)."""
    return (limits or ResourceLimits()).memory_mb + PROXY_LIMITS.memory_bytes // 2**20


def slots_for(budget_mb: int, per_rollout_mb: int, cpus: int) -> int:
    """As many rollouts as the memory budget admits at once, and no more than the local backend's per-CPU default."""
    return max(0, min(budget_mb // per_rollout_mb, max(2, cpus * ROLLOUTS_PER_CPU)))


def node_capacity(overcommit: float = DEFAULT_OVERCOMMIT, limits: ResourceLimits | None = None) -> NodeCapacity:
    """This machine's capacity, from the budget the local backend admits against (OPENCODE_ENV_MEMORY_OVERCOMMIT)."""
    budget, per_rollout, cpus = memory_budget_mb(overcommit), rollout_memory_mb(limits), os.cpu_count() or 1
    return NodeCapacity(
        slots=slots_for(budget, per_rollout, cpus), memory_budget_mb=budget, rollout_memory_mb=per_rollout, cpus=cpus
    )


def ray_resources_json(capacity: NodeCapacity) -> str:
    """The value of `ray start --resources` for this node."""
    return json.dumps({SLOT_RESOURCE: capacity.slots})
