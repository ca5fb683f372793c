"""Harbor test.sh tasks and the grader's box: a plain test.sh is graded in the agent's box (it may check state only
that box has) unless its task.toml opts into the grader's box with our `[verifier] sandbox = "fresh"`; the result's
grade_isolation says which. The test.sh is in Harbor's template style: it installs a pytest reporting plugin (here
offline: a distribution with a `pytest11` entry point written by the script itself, standing in for `uvx -w
pytest-json-ctrf`), runs pytest with the plugin's option and writes the reward from pytest's exit status."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.tasks.harbor import request_from_task_dir

PLUGIN = """\
import json


def pytest_addoption(parser):
    parser.addoption("--ctrf", action="store", default=None)


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--ctrf")
    if path:
        with open(path, "w") as out:
            json.dump({"results": {"exit": int(exitstatus)}}, out)
"""
TEMPLATE_TEST_SH = f"""\
#!/bin/bash
site=/tmp/verifier-site
mkdir -p $site/ctrf_like-0.1.dist-info
cat > $site/ctrf_like.py <<'PY'
{PLUGIN}PY
printf 'Metadata-Version: 2.1\\nName: ctrf-like\\nVersion: 0.1\\n' > $site/ctrf_like-0.1.dist-info/METADATA
printf '[pytest11]\\nctrf = ctrf_like\\n' > $site/ctrf_like-0.1.dist-info/entry_points.txt
PYTHONPATH=$site python3 -m pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
TEST_OUTPUTS = """\
import os
import sys

sys.path.insert(0, os.getcwd())  # Harbor's tests name the task's directory (/app) the same way


def test_add():
    from calc import add

    assert add(2, 3) == 5
"""
HONEST = "printf 'def add(a, b):\\n    return a + b\\n' > calc.py\n"
WRONG = "printf 'def add(a, b):\\n    return a - b\\n' > calc.py\n"
FORCE_PASS = "def pytest_runtest_logreport(report):\n    report.outcome = 'passed'\n"
WRONG_WITH_A_PLUGIN = (
    WRONG
    + "mkdir -p Evil.DIST-INFO && printf '[pytest11]\\nzz = zz_plugin\\n' > Evil.DIST-INFO/entry_points.txt\n"
    + "printf 'Metadata-Version: 2.1\\nName: evil\\nVersion: 1\\n' > Evil.DIST-INFO/METADATA\n"
    + f"printf {FORCE_PASS!r} > zz_plugin.py\n"
)


def task_dir(root: Path, solution: str, sandbox: str | None) -> Path:
    task = root / "template-calc"
    for part in ("tests", "solution"):
        (task / part).mkdir(parents=True)
    (task / "instruction.md").write_text("Write add(a, b) in calc.py.\n")
    opt_in = f'sandbox = "{sandbox}"\n' if sandbox else ""
    config = f"""\
        version = "1.1"
        [verifier]
        timeout_sec = 120.0
        {opt_in}
        [environment]
        docker_image = "{build_base_image()}"
        """
    (task / "task.toml").write_text(textwrap.dedent(config))
    (task / "tests" / "test.sh").write_text(TEMPLATE_TEST_SH)
    (task / "tests" / "test_outputs.py").write_text(TEST_OUTPUTS)
    (task / "solution" / "solve.sh").write_text(solution)
    return task


@pytest.mark.parametrize(("sandbox", "isolation"), [(None, "agent_box"), ("fresh", "fresh_box")])
async def test_an_honest_solution_gets_one_on_a_template_test_sh(
    backend: LocalBackend, tmp_path: Path, sandbox: str | None, isolation: str
) -> None:
    result = await run_rollout(request_from_task_dir(task_dir(tmp_path, HONEST, sandbox), oracle=True), backend)
    assert result.status == "completed", result.error
    assert (result.reward, result.grade_isolation) == (1.0, isolation), result.verify_results


async def test_a_test_sh_task_in_the_grader_box_ignores_the_agents_plugin(
    backend: LocalBackend, tmp_path: Path
) -> None:
    request = request_from_task_dir(task_dir(tmp_path, WRONG_WITH_A_PLUGIN, "fresh"), oracle=True)
    result = await run_rollout(request, backend)
    assert result.status == "completed", result.error
    assert (result.reward, result.grade_isolation) == (0.0, "fresh_box"), result.verify_results
    assert ("Evil.DIST-INFO", "package_metadata") in {(item.path, item.kind) for item in result.integrity}
