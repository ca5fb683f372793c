"""`check-task` takes a Harbor task directory (its solve.sh is the oracle) as well as a TASK.json; a directory that
is no task, and a Dockerfile FROM an image this machine does not have, are refused with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_env.cli import main
from tests.integration.test_harbor_rollout import _task_dir

pytestmark = pytest.mark.timeout(600)


def test_check_task_on_a_harbor_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task_dir(tmp_path, "fix-calc", solution="sed -i 's/a - b/a + b/' /app/calc.py\n")
    assert main(["check-task", str(task)]) == 0
    out = capsys.readouterr().out
    assert "verdict:    ok: the oracle solves the task and doing nothing does not" in out


def test_check_task_on_a_dir_that_is_no_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-task", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "Is a directory" not in error
    assert "task.toml" in error


def test_a_base_image_not_here_says_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task_dir(tmp_path, "no-base", solution="true\n")
    (task / "environment" / "Dockerfile").write_text("FROM localhost/opencode-env-test-never-built:1\n")
    assert main(["check-task", str(task)]) == 2
    error = capsys.readouterr().err
    assert "image not known" in error
    assert "localhost/opencode-env-test-never-built:1 is not in this machine's container storage" in error
    assert "podman load -i IMAGE.tar" in error
    assert "podman pull localhost/opencode-env-test-never-built:1" in error
