"""What a node's failure makes of a rollout: a result with an infrastructure status (no reward, never scored), the
request it ran and what went wrong, or a warning on the retry that replaced it. Pure: no Ray here."""

from __future__ import annotations

from pydantic import BaseModel

from opencode_env.wire import RolloutRequest, RolloutResult, RolloutStatus
from opencode_env.wire.notices import Notice


class NodeFault(BaseModel):
    """One attempt that a node's failure (or the driver's deadline) cut short."""

    attempt: int
    node: str
    reason: str


def failed_on_cluster(
    request: RolloutRequest, fault: NodeFault, status: RolloutStatus = "sandbox_error"
) -> RolloutResult:
    """The result of an attempt lost with its node: an infrastructure status, reward None, the request (without its
    key). What the rollout captured lived on that node and is gone with it; the error says where and why."""
    result = RolloutResult(
        task_id=request.task_id,
        mode=request.mode,
        status=status,
        error=f"attempt {fault.attempt} on node {fault.node}: {fault.reason}",
        reward=None,
        oracle=request.solution is not None,
        task=request.model_copy(update={"api_key": ""}),
        backend="local (ray)",
    )
    result.warn(
        "node_lost",
        f"infrastructure: the rollout was lost with node {fault.node}; no reward, do not train on it",
        severity="error",
        fix="run the attempt again (eval --retry-infra)",
    )
    return result


def marked_as_retry(result: RolloutResult, faults: list[NodeFault]) -> RolloutResult:
    """A result that replaced attempts lost with their nodes says so: it is a new sample, not the first one resumed."""
    lost = "; ".join(f"attempt {fault.attempt} on node {fault.node}: {fault.reason}" for fault in faults)
    note = (
        f"retry: this is attempt {len(faults) + 1}, a new sample run from the start after the earlier attempt(s) "
        f"failed on our side ({lost})"
    )
    retried = result.model_copy(deep=True)
    retried.notices = [Notice(code="retried_attempt", severity="warning", message=note), *retried.warning_notices()]
    retried.order_warnings()
    return retried
