"""`check-task`: is the task solvable (its oracle reaches 1.0) and not free (doing nothing
scores below 1.0)? A task file is a RolloutRequest in JSON whose `solution` holds the reference solution."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.wire import RolloutRequest, RolloutResult, is_infrastructure_failure

Verdict = Literal["ok", "broken", "inconclusive"]
EXIT_CODES: dict[Verdict, int] = {"ok": 0, "broken": 1, "inconclusive": 2}


@dataclass(frozen=True)
class TaskCheck:
    oracle: RolloutResult
    nothing: RolloutResult
    verdict: Verdict
    reason: str


def judge(oracle: RolloutResult, nothing: RolloutResult) -> tuple[Verdict, str]:
    """The verdict on a task from its oracle run and its do-nothing run."""
    for name, run in (("oracle", oracle), ("do-nothing", nothing)):
        if is_infrastructure_failure(run.status):
            return "inconclusive", f"the {name} run failed on our side ({run.status}): {run.error}"
    if oracle.status == "setup_failed":
        return "broken", f"setup fails, so nothing can solve it: {oracle.error}"
    if oracle.reward != 1.0:
        problem = f" ({oracle.error})" if oracle.error else ""
        return "broken", f"the oracle reaches reward {oracle.reward}, not 1.0{problem}: the task is unsolvable"
    if nothing.reward is not None and nothing.reward >= 1.0:
        return "broken", "doing nothing already scores 1.0: the task rewards no work"
    return "ok", "the oracle solves the task and doing nothing does not"


async def check_task(request: RolloutRequest, backend: SandboxBackend) -> TaskCheck:
    """Run the oracle and the do-nothing agent side by side on `backend`."""
    if request.solution is None:
        raise ValueError("solution: the task has none; add the reference solution's shell commands")
    oracle, nothing = await asyncio.gather(
        run_rollout(request, backend),
        run_rollout(request.model_copy(update={"solution": []}), backend),
    )
    verdict, reason = judge(oracle, nothing)
    return TaskCheck(oracle, nothing, verdict, reason)
