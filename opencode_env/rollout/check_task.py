"""`check-task`: is the task solvable (its oracle reaches 1.0) and not free (doing nothing
scores below 1.0)? A task file is a RolloutRequest in JSON whose `solution` holds the reference solution."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Literal

from opencode_env.rollout.integrity import GRADER_CONFIG_NAMES
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
    warnings: tuple[str, ...] = ()


TEST_FILE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$")
RUNS_PYTEST = re.compile(r"(^|[\s/;&|(])(py\.test|pytest)(\s|$)|-m\s+pytest")


def task_warnings(request: RolloutRequest) -> list[str]:
    """What lets an agent move its grade without solving the task, as far as the request shows it: tests it can
    edit (written before it runs and not handed over again), grader configuration the task lets it keep."""
    warnings = []
    runs_pytest = any(RUNS_PYTEST.search(command) for command in request.verify)
    if runs_pytest and not request.verify_files:
        warnings.append(
            "verify runs pytest but hands over no protected tests (verify_files): the agent can edit the tests it "
            "is graded by; hand them over in verify_files (written in just before verify, replacing the agent's)"
        )
    for path in sorted(request.files):
        if TEST_FILE.search(path) and path not in request.verify_files:
            warnings.append(
                f"{path} is written before the agent runs and not handed over again in verify_files: the agent can "
                "change what verify runs"
            )
    for path in request.solution_files:
        if TEST_FILE.search(path) or path.rsplit("/", 1)[-1] in GRADER_CONFIG_NAMES:
            warnings.append(f"solution_files names {path}: the agent's version of it configures the grader, unchecked")
    return warnings


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
    return TaskCheck(oracle, nothing, verdict, reason, tuple(task_warnings(request)))
