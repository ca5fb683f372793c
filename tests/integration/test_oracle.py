"""Oracle runs (the task's solution in place of the agent) and `opencode-env check-task`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from opencode_env.cli import main
from opencode_env.rollout.check_task import judge
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.wire import MAX_COMMANDS, RolloutRequest, RolloutResult

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "task_hello.json"
WORKDIR = "/home/user/workdir"
SOLVED = f'cd {WORKDIR} && test "$(cat answer.txt)" = 42'


def task(**fields: object) -> RolloutRequest:
    base: dict[str, object] = {"instruction": "Write 42 to answer.txt", "verify": [SOLVED], "task_id": "answer"}
    return RolloutRequest.model_validate({**base, **fields})


async def test_an_oracle_run_uses_no_model_and_reaches_the_reward(backend: LocalBackend, no_leaks: None) -> None:
    result = await run_rollout(task(solution=[f"echo 42 > {WORKDIR}/answer.txt", "echo solved"]), backend)
    assert (result.status, result.reward, result.reward_source) == ("completed", 1.0, "verify_pass_rate")
    assert result.oracle
    assert [(r.exit_code, r.stdout) for r in result.solution_results] == [(0, ""), (0, "solved\n")]
    assert result.proxy_turns == []
    assert result.usage.llm_calls == 0
    assert result.upstream.base_url == ""
    assert result.files["answer.txt"] == "42\n"
    assert result.timings.proxy_s is None


async def test_the_empty_solution_is_the_do_nothing_agent(backend: LocalBackend, no_leaks: None) -> None:
    result = await run_rollout(task(solution=[]), backend)
    assert (result.status, result.reward, result.oracle, result.agent_exit_code) == ("completed", 0.0, True, 0)
    assert result.solution_results == []
    assert [r.exit_code for r in result.verify_results] == [1]


async def test_a_failing_solution_stops_there_and_verify_still_runs(backend: LocalBackend, no_leaks: None) -> None:
    result = await run_rollout(task(solution=["exit 3", "echo 42 > answer.txt"]), backend)
    assert (result.status, result.failed_phase) == ("agent_error", "agent")
    assert result.error == "solution command 1 exited 3: exit 3"
    assert [r.exit_code for r in result.solution_results] == [3]
    assert (result.reward, [r.exit_code for r in result.verify_results]) == (0.0, [1])


async def test_a_setup_failure_stops_an_oracle_run_before_its_solution(backend: LocalBackend, no_leaks: None) -> None:
    result = await run_rollout(task(setup=["false"], solution=["echo 42 > answer.txt"]), backend)
    assert (result.status, result.solution_results, result.verify_results) == ("setup_failed", [], [])


def test_solution_has_the_bounds_of_setup_commands() -> None:
    with pytest.raises(ValidationError, match="solution") as too_many:
        task(solution=["true"] * (MAX_COMMANDS + 1))
    assert str(MAX_COMMANDS) in str(too_many.value)
    with pytest.raises(ValidationError, match=r"solution\.0"):
        task(solution=[""])
    assert task().solution is None
    assert "do-nothing" in (RolloutRequest.model_fields["solution"].description or "")


def run_judge(oracle: dict[str, object], nothing: dict[str, object]) -> tuple[str, str]:
    return judge(RolloutResult.model_validate(oracle), RolloutResult.model_validate(nothing))


def test_the_verdicts() -> None:
    assert run_judge({"reward": 1.0}, {"reward": 0.0})[0] == "ok"
    assert run_judge({"reward": 1.0}, {"reward": None, "status": "agent_error"})[0] == "ok"
    assert run_judge({"reward": 0.5}, {"reward": 0.0}) == (
        "broken",
        "the oracle reaches reward 0.5, not 1.0: the task is unsolvable",
    )
    free = "doing nothing already scores 1.0: the task rewards no work"
    assert run_judge({"reward": 1.0}, {"reward": 1.0}) == ("broken", free)
    assert run_judge({"status": "setup_failed", "error": "setup command 1 exited 1"}, {})[0] == "broken"
    verdict, reason = run_judge({"reward": 1.0}, {"status": "sandbox_error", "error": "no space"})
    assert (verdict, reason) == ("inconclusive", "the do-nothing run failed on our side (sandbox_error): no space")


def write_task(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "task.json"
    path.write_text(task(**fields).model_dump_json(exclude_defaults=True))
    return path


def test_check_task_passes_the_example(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check-task", str(EXAMPLE), "--save", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("oracle:     reward 1.0 (completed")
    assert lines[1].startswith("do-nothing: reward 0.0 (completed")
    assert lines[2] == "verdict:    ok: the oracle solves the task and doing nothing does not"
    saved = RolloutResult.model_validate_json((tmp_path / "oracle.json").read_text())
    assert saved.oracle
    assert saved.task_id == json.loads(EXAMPLE.read_text())["task_id"]


def test_check_task_fails_an_unsolvable_task(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check-task", str(write_task(tmp_path, solution=["echo 41 > answer.txt"]))]) == 1
    assert "verdict:    broken: the oracle reaches reward 0.0" in capsys.readouterr().out


def test_check_task_fails_a_task_that_pays_for_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check-task", str(write_task(tmp_path, verify=["true"], solution=["true"]))]) == 1
    assert "verdict:    broken: doing nothing already scores 1.0" in capsys.readouterr().out


def test_check_task_needs_a_solution_and_a_valid_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check-task", str(write_task(tmp_path))]) == 2
    assert "solution: the task has none" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"instruction": "x", "solution": "echo not a list"}))
    assert main(["check-task", str(bad)]) == 2
    assert "solution" in capsys.readouterr().err
