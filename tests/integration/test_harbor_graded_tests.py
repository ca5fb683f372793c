"""A Harbor task that hands over its tests: `[verifier.tests]` in task.toml names the ids that must pass, and the
product's test grader runs tests/ in place of test.sh (which here would reward anything). The honest fix gets 1.0
by test id; a wrong fix that exits 0 as the tests import it gets 0.0 and a finding (`by_value_broken`: auto grades
these tests by value)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.tasks.harbor import HarborTask, request_from_task_dir

ANY_REWARD_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
HONEST = "printf 'def add(a, b):\\n    return a + b\\n' > calc.py\n"
EXIT_ZERO = "printf 'import os\\nos._exit(0)\\ndef add(a, b):\\n    return 0\\n' > calc.py\n"


def _task_dir(root: Path, solution: str) -> Path:
    task = root / "graded-calc"
    for part in ("tests", "solution"):
        (task / part).mkdir(parents=True)
    (task / "instruction.md").write_text("Write add(a, b) in calc.py.\n")
    (task / "task.toml").write_text(
        textwrap.dedent(
            f"""\
            version = "1.1"
            [verifier]
            timeout_sec = 120.0
            [verifier.tests]
            fail_to_pass = ["test_calc.py::test_add", "test_calc.py::test_add_negative"]
            [environment]
            docker_image = "{build_base_image()}"
            """
        )
    )
    (task / "tests" / "test.sh").write_text(ANY_REWARD_SH)
    (task / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_add_negative():\n    assert add(-2, -3) == -5\n"
    )
    (task / "solution" / "solve.sh").write_text(solution)
    return task


def test_the_task_becomes_a_test_grader_request(tmp_path: Path) -> None:
    task = _task_dir(tmp_path, HONEST)
    request = request_from_task_dir(task, oracle=True)
    assert request.verify == []
    assert request.verify_files == {}
    assert request.tests is not None
    assert request.tests.fail_to_pass == ["test_calc.py::test_add", "test_calc.py::test_add_negative"]
    assert set(request.tests.files) == {"test_calc.py"}
    assert (
        "[verifier] tests: graded by the listed test ids; tests/test.sh is not run"
        in HarborTask.from_dir(task).unsupported
    )


@pytest.mark.parametrize(("solution", "reward"), [(HONEST, 1.0), (EXIT_ZERO, 0.0)], ids=["honest", "exit-zero"])
async def test_the_reward_comes_from_the_test_ids(
    backend: LocalBackend, tmp_path: Path, solution: str, reward: float
) -> None:
    """The tests call plain functions with plain values, so auto grades them by value: the exit at import ends the
    code's own process, not pytest's, and the broken channel is the agent's 0 with a finding (a policy status)."""
    result = await run_rollout(request_from_task_dir(_task_dir(tmp_path, solution), oracle=True), backend)
    assert result.test_mode == "by_value", result.test_mode_reason
    assert result.status == ("completed" if reward else "agent_error"), result.error
    assert bool(reward) != any(finding.kind == "by_value_broken" for finding in result.integrity)
    assert result.reward_source == "tests"
    assert result.reward == reward
    assert result.grade_isolation == "fresh_box"
    outcomes = {outcome.test_id: outcome.outcome for outcome in result.test_outcomes}
    assert set(outcomes) == {"test_calc.py::test_add", "test_calc.py::test_add_negative"}
    assert all((outcome == "passed") == bool(reward) for outcome in outcomes.values()), outcomes
