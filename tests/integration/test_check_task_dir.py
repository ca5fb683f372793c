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


CORPUS = Path(__file__).resolve().parents[1] / "harbor_corpus"
ONLINE_TEST_SH = """\
#!/bin/bash
curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh
source $HOME/.local/bin/env
uvx --with pytest==8.4.1 pytest /tests/test_greeting.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def _copy(name: str, root: Path) -> Path:
    """A corpus task copied (its environment/ unchanged, so its image is the one built already)."""
    task = root / name
    for path in (CORPUS / name).rglob("*"):
        if path.is_file():
            (task / path.relative_to(CORPUS / name)).parent.mkdir(parents=True, exist_ok=True)
            (task / path.relative_to(CORPUS / name)).write_bytes(path.read_bytes())
    return task


def test_a_test_sh_that_installs_from_the_internet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Harbor's usual test.sh (the uv installer, then uvx) offline: each network line is warned about first, and the
    runs are inconclusive, never 'unsolvable': verify graded the sandbox's network."""
    task = _copy("hello-app", tmp_path)
    (task / "tests" / "test.sh").write_text(ONLINE_TEST_SH)
    assert main(["check-task", str(task), "--save", str(tmp_path / "saved")]) == 2
    captured = capsys.readouterr()
    assert "warning: tests/test.sh line 2 reaches the network? curl -LsSf https://astral.sh" in captured.err
    assert "warning: tests/test.sh line 4 reaches the network? uvx --with pytest" in captured.err
    assert "verdict:    inconclusive: the oracle run's verify failed to reach the network: curl: (" in captured.out
    saved = (tmp_path / "saved" / "oracle.json").read_text()
    assert '"verify_network_failure": "curl: (' in saved


def test_a_task_without_a_solution_gets_a_build_and_a_do_nothing_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = _copy("hello-app", tmp_path)
    for path in (task / "solution").iterdir():
        path.unlink()
    (task / "solution").rmdir()
    assert main(["check-task", str(task)]) == 2
    captured = capsys.readouterr()
    assert "solution/solve.sh: missing, so only doing nothing is run (no oracle)" in captured.err
    assert "oracle:     none (the task has no solution)" in captured.out
    assert "do-nothing: reward 0.0 (completed, reward_txt)" in captured.out
    assert "verdict:    inconclusive: the task has no solution, so whether it can be solved is unknown" in captured.out


def test_an_unknown_key_is_an_error_in_check_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _copy("hello-app", tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\ntimeout_sec", "[agent]\ntimeout_secs"))
    assert main(["check-task", str(task)]) == 2
    error = capsys.readouterr().err
    assert "[agent] timeout_secs: unknown key, ignored (did you mean 'timeout_sec'?)" in error


def test_check_task_on_a_multi_step_dir(capsys: pytest.CaptureFixture[str]) -> None:
    """Doing nothing empties every step's solution, not only the task's: the oracle's steps pass, nothing's do not."""
    corpus = Path(__file__).resolve().parents[1] / "harbor_corpus" / "multi-step-greet"
    assert main(["check-task", str(corpus)]) == 0
    out = capsys.readouterr().out
    assert "verdict:    ok: the oracle solves the task and doing nothing does not" in out
