"""A Harbor task directory end to end on the local backend: its Dockerfile built offline with podman on the base
image, the real OpenCode working in the image's WORKDIR, Harbor's tests copied in only for verify and run as the
sandbox's root, writing /logs/verifier/reward.txt; the oracle reaches 1.0, an agent that does nothing 0.0. Then
the eval runner over task dirs, resumed."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import pytest

from opencode_env.evals import load_tasks, run_eval
from opencode_env.rollout.in_process import InProcess
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash
from opencode_env.tasks.harbor import request_from_task_dir
from opencode_env.wire import RolloutResult

TEST_SH = """\
#!/bin/bash
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _task_dir(root: Path, name: str, *, solution: str) -> Path:
    """A Harbor task: fix add() in /app/calc.py. Its image runs one RUN step (a container runtime at build)."""
    task = root / name
    for part in ("environment", "tests", "solution"):
        (task / part).mkdir(parents=True)
    (task / "instruction.md").write_text("Fix add() in /app/calc.py: it must return a + b.\n")
    (task / "task.toml").write_text(
        textwrap.dedent(
            """\
            version = "1.0"
            [metadata]
            difficulty = "easy"
            [verifier]
            timeout_sec = 120.0
            [agent]
            timeout_sec = 120.0
            [environment]
            build_timeout_sec = 600.0
            cpus = 1
            memory_mb = 2048
            storage_mb = 2048
            """
        )
    )
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {build_base_image()}\nWORKDIR /app\nCOPY calc.py /app/calc.py\n"
        "RUN python3 -c \"print('built in the image')\" > /app/built.txt\n"
    )
    (task / "environment" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "tests" / "test_outputs.py").write_text(
        "import sys\n\nsys.path.insert(0, '/app')\nfrom calc import add\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n"
    )
    (task / "solution" / "solve.sh").write_text(solution)
    return task


@pytest.fixture(scope="module")
def calc_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _task_dir(tmp_path_factory.mktemp("harbor"), "fix-calc", solution="sed -i 's/a - b/a + b/' /app/calc.py\n")


async def test_the_oracle_solves_the_task(backend: LocalBackend, calc_task: Path) -> None:
    request = request_from_task_dir(calc_task, oracle=True)
    assert (request.workdir, request.verify_as, request.verify) == ("/app", "root", ["bash /tests/test.sh"])
    result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert result.reward_source == "reward_txt"
    assert result.files["calc.py"] == "def add(a, b):\n    return a + b\n"
    assert result.files["built.txt"] == "built in the image\n"
    assert "test_outputs.py" not in str(result.files), "Harbor's tests live in /tests, never in the work dir"


async def test_an_agent_that_does_nothing_gets_zero(backend: LocalBackend, calc_task: Path) -> None:
    with ScriptedModelServer(Script(steps=[], final_text="I will not change anything.")) as model:
        request = request_from_task_dir(
            calc_task, endpoint="vllm", base_url=model.base_url, model=model.model.model_name
        )
        result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert result.reward == 0.0
    assert result.verify_results[0].exit_code == 0
    assert result.files["calc.py"] == "def add(a, b):\n    return a - b\n"


async def test_the_agent_edits_the_images_workdir(backend: LocalBackend, calc_task: Path) -> None:
    """OpenCode starts in /app (the image's WORKDIR, handed to the agent's uid) and its bash tool fixes the file."""
    script = Script(steps=[bash("pwd > where.txt && sed -i 's/a - b/a + b/' calc.py", "fix add")])
    with ScriptedModelServer(script) as model:
        request = request_from_task_dir(
            calc_task, endpoint="vllm", base_url=model.base_url, model=model.model.model_name
        )
        result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert result.files["where.txt"] == "/app\n"
    assert result.reward == 1.0


async def test_eval_over_task_dirs_resumes(backend: LocalBackend, tmp_path: Path) -> None:
    tasks_root = tmp_path / "tasks"
    _task_dir(tasks_root, "solved", solution="sed -i 's/a - b/a + b/' /app/calc.py\n")
    _task_dir(tasks_root, "unsolved", solution="true\n")
    out = tmp_path / "eval"
    tasks = load_tasks([tasks_root], oracle=True)
    assert sorted(task.task_id for task in tasks) == ["solved", "unsolved"]
    lines: list[str] = []
    summary = await run_eval(tasks, out=out, k=2, concurrency=2, runner=InProcess(backend), report=lines.append)
    by_task = {task.task_id: task for task in summary.tasks}
    assert (by_task["solved"].pass_at_k, by_task["unsolved"].pass_at_k) == (1.0, 0.0)
    assert summary.overall.attempts == 4
    assert sorted(path.name for path in (out / "results" / "solved").glob("*.json")) == ["1.json", "2.json"]
    assert "solved/1.html" in (out / "index.html").read_text()
    stamps = {path: path.stat().st_mtime_ns for path in out.rglob("*.json") if path.parent.parent.name == "results"}
    again = await run_eval(tasks, out=out, k=2, concurrency=2, runner=InProcess(backend), report=lines.append)
    assert again.overall.attempts == 4
    assert {path: path.stat().st_mtime_ns for path in stamps} == stamps


async def test_run_a_task_dir_from_the_command_line(calc_task: Path, sandbox_base: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "opencode_env.cli",
        "run",
        "--task",
        str(calc_task),
        "--oracle",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(sandbox_base)},
    )
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()[-2000:]
    result = RolloutResult.model_validate_json(stdout)
    assert (result.status, result.reward, result.task.workdir if result.task else None) == ("completed", 1.0, "/app")


async def test_the_shipped_example_task(backend: LocalBackend) -> None:
    """examples/harbor/fix-calc, as the README runs it: the oracle solves it, doing nothing does not."""
    task = Path(__file__).resolve().parents[2] / "examples" / "harbor" / "fix-calc"
    solved = await run_rollout(request_from_task_dir(task, oracle=True), backend)
    nothing = await run_rollout(request_from_task_dir(task, oracle=True).model_copy(update={"solution": []}), backend)
    assert (solved.status, solved.reward, solved.grade_isolation) == ("completed", 1.0, "fresh_box"), solved.error
    assert (nothing.status, nothing.reward) == ("completed", 0.0), nothing.error
