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


ROOT_ONLY = "/etc/oracle-was-here"


async def test_a_solution_as_root_writes_root_owned_paths_and_says_so(backend: LocalBackend, no_leaks: None) -> None:
    """Harbor's oracle runs as the container's root: `solution_as="root"` runs it as the sandbox's own root (an
    unprivileged uid on the host), and the result records each phase's identity. As `user` the same solution fails."""
    fields = {
        "solution": [f"id -u > {ROOT_ONLY}"],
        "verify": [f'test "$(cat {ROOT_ONLY})" = 0'],
        "verify_sandbox": "same",
    }
    as_root = await run_rollout(task(solution_as="root", **fields), backend)
    assert (as_root.status, as_root.reward) == ("completed", 1.0), as_root.error
    assert as_root.identities == {"agent": "root", "verify": "grader"}
    as_user = await run_rollout(task(**fields), backend)
    assert (as_user.status, as_user.reward) == ("agent_error", 0.0)
    assert "Permission denied" in as_user.error, as_user.error
    assert as_user.identities == {"agent": "user", "verify": "grader"}


async def test_a_root_solution_cannot_write_the_grade(backend: LocalBackend, no_leaks: None) -> None:
    """The oracle as root forges the reward file, then leaves a process behind to forge it again during verify; the
    grade is still verify's own (it writes nothing and fails)."""
    reward = "/home/user/logs/verifier/reward.txt"
    forge = f"mkdir -p {reward.rsplit('/', 1)[0]} && echo 1 > {reward} && chmod 444 {reward}"
    later = f"(for i in $(seq 100); do echo 1 > {reward} 2>/dev/null; sleep 0.1; done) > /dev/null 2>&1 &"
    request = task(
        solution_as="root",
        solution=[forge, later],
        verify=[f"sleep 2; test -f {reward} && cat {reward}; exit 1"],
        reward_files=["reward.txt"],
        verify_sandbox="same",
    )
    result = await run_rollout(request, backend)
    assert result.identities["agent"] == "root"
    assert result.reward == 0.0, (result.reward_source, result.verify_results)
    assert result.verify_results[0].stdout == ""
