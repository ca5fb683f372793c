"""The runner seam's contract (opencode_env/wire/runner.py), held by every runner the same way: `InProcess` and
`OpenCodeEnv` in tests/contract/test_runners.py, `RayRollouts` on a simulated cluster in
tests/cluster/test_runner_contract.py. Oracle tasks (the solution runs in place of the agent): the runner's part is
what is checked, not OpenCode's. Each check is a coroutine taking the runner; the modules name them as tests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from opencode_env.evals import EvalConfig, run_eval
from opencode_env.evals.trl_rollout import make_rollout_func
from opencode_env.wire import RolloutRequest, RolloutResult, Runner, SandboxPlace

WORKDIR = "/home/user/workdir"
ANSWERED = f'cd {WORKDIR} && test "$(cat answer.txt)" = 42'
KEY = "sk-runner-contract-never-on-disk"


def oracle(task_id: str, answer: int) -> RolloutRequest:
    return RolloutRequest(
        instruction="Write 42 to answer.txt",
        verify=[ANSWERED],
        task_id=task_id,
        solution=[f"echo {answer} > {WORKDIR}/answer.txt"],
        api_key=KEY,
    )


SOLVED = oracle("solved", 42)
UNSOLVED = oracle("unsolved", 41)
BROKEN = RolloutRequest(
    instruction="x", task_id="broken", solution=["true"], image="localhost/opencode-env-no-such-image:never"
)
"""An image no node has: the sandbox cannot be made, and the runner says so in a result, never by raising."""


def check_capabilities(runner: Runner, place: SandboxPlace) -> None:
    declared = runner.capabilities
    assert declared.sandboxes == place
    assert declared.max_concurrency >= 1
    assert declared.where


async def check_run_one(runner: Runner) -> None:
    solved, unsolved = await asyncio.gather(runner.run_rollout(SOLVED), runner.run_rollout(UNSOLVED))
    assert (solved.task_id, solved.status, solved.reward) == ("solved", "completed", 1.0)
    assert (unsolved.task_id, unsolved.status, unsolved.reward) == ("unsolved", "completed", 0.0)


async def check_partial(runner: Runner) -> None:
    """Only a runner whose pipeline runs here fills the caller's partial result; the others leave it as given."""
    partial = RolloutResult()
    result = await runner.run_rollout(SOLVED, partial=partial)
    assert result.reward == 1.0
    if runner.capabilities.sandboxes == "this_process":
        assert partial.status == "completed"
    else:
        assert partial == RolloutResult()


async def check_run_many_in_request_order(runner: Runner) -> None:
    requests = [oracle(f"task-{index}", 42 if index % 2 == 0 else 41) for index in range(5)]
    for cap in (1, None):
        results = await runner.run_rollouts(requests, max_concurrency=cap, progress=False)
        assert [result.task_id for result in results] == [request.task_id for request in requests]
        assert [result.reward for result in results] == [1.0, 0.0, 1.0, 0.0, 1.0]


async def check_a_failure_is_a_result(runner: Runner) -> None:
    [broken, solved] = await runner.run_rollouts([BROKEN, SOLVED], progress=False)
    assert broken.task_id == "broken"
    assert broken.status == "sandbox_error", broken.error
    assert broken.reward is None
    assert solved.reward == 1.0


async def check_eval(runner: Runner, out: Path) -> None:
    lines: list[str] = []
    summary = await run_eval([SOLVED, UNSOLVED], out=out, k=2, runner=runner, report=lines.append)
    assert [(task.task_id, task.scored, task.successes) for task in summary.tasks] == [
        ("solved", 2, 2),
        ("unsolved", 2, 0),
    ]
    assert EvalConfig.model_validate_json((out / "eval.json").read_text()).runs_on == runner.capabilities.where
    assert all(KEY not in path.read_text() for path in out.rglob("*") if path.is_file())


def check_rollout_func(runner: Runner) -> None:
    """TRL calls rollout_func synchronously (each prompt already repeated num_generations times): one row per
    prompt, in order. An oracle rollout has no model turn, so its row is not trainable (reward None for TRL)."""
    tasks = {"solved": SOLVED, "unsolved": UNSOLVED}
    rollout_func = make_rollout_func(runner, tasks.__getitem__, max_concurrency=2)
    rows: dict[str, list[Any]] = rollout_func(["solved", "unsolved", "solved"], None)
    assert rows["task_id"] == ["solved", "unsolved", "solved"]
    assert rows["status"] == ["completed"] * 3
    assert rows["reward"] == [None] * 3
    assert len(rows["prompt_ids"]) == len(rows["completion_ids"]) == 3


async def check_audit(runner: Runner, out: Path) -> None:
    """An audit of one task with one play on the runner: the same records whichever runner played them."""
    from opencode_env.audit.driver import Audit
    from opencode_env.audit.inputs import load_audit_inputs
    from opencode_env.audit.plays import panel

    dataset = Path(__file__).resolve().parents[1] / "examples" / "audit" / "exit-status-import.json"
    loaded = load_audit_inputs([dataset])
    report = await Audit(runner, panel(only=["exit-zero-import"]), out).run(loaded.tasks)
    (task,) = report.tasks
    assert [(check.layout, check.verdict) for check in task.checks] == [("native", "ok"), ("ours", "ok")]
    native, ours = task.records
    assert (native.layout, native.outcome, native.reward, native.baseline) == ("native", "admitted", 1.0, 0.0)
    assert ours.layout == "ours"
    assert ours.outcome in {"admitted", "blocked"}
    assert report.rollouts == 6
    assert (out / native.result_file).is_file()
