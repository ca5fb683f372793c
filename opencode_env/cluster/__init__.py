"""Rollouts on a Ray cluster (the `opencode-env[ray]` extra): the only package of ours that imports Ray.

`RayRollouts` (executor.py) is the driver, with the client's `run_rollouts` shape; `NodeRunner` (node.py) is the
long-lived actor on each node; capacity.py computes the slots a node advertises. See docs/cluster.md."""

from __future__ import annotations

from opencode_env.cluster.capacity import SLOT_RESOURCE, NodeCapacity, node_capacity
from opencode_env.cluster.executor import ClusterError, RayRollouts
from opencode_env.cluster.node import NodeConfig, NodeReport

__all__ = [
    "SLOT_RESOURCE",
    "ClusterError",
    "NodeCapacity",
    "NodeConfig",
    "NodeReport",
    "RayRollouts",
    "node_capacity",
]
