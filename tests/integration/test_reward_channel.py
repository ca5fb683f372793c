"""The reward from a channel only the grader writes, through the real pipeline (oracle runs of Harbor test.sh tasks
on the local backend, the E2B fake for the link attack): the code under test (a WRONG calc.py) plays one trick on the
reward file when pytest imports it; each gets 0.0 and, where the trick got anywhere, a policy status and a finding
naming it. Each honest test.sh style still gets 1.0.

The task's test.sh and pytest run as one identity (Harbor's default: the sandbox's root; `[verifier] user` names our
unprivileged grader), so the code under test can write whatever test.sh can. What it cannot do: replace the reward
file (a root's file in a root's sticky directory: for the unprivileged grader the kernel refuses; a root grader's
replacement is found by the host, which made the file), have its write counted from a verify it killed or hung, or
reach past the task's reward range.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.scripted.demo import DEMO_INSTRUCTION, DEMO_VERIFY
from opencode_env.tasks.harbor import request_from_task_dir
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_cloud_backends import PROVIDERS
from tests.integration.test_harbor_grade_box import TEMPLATE_TEST_SH, TEST_OUTPUTS

PYTEST = "python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py"
REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"
STYLES = {
    "if/else echo": f"if {PYTEST}; then echo 1 > {REWARD_TXT}; else echo 0 > {REWARD_TXT}; fi\n",
    "&& echo, no else": f"{PYTEST} && echo 1 > {REWARD_TXT}\n",
    "a Python writer of reward.json": (
        f"{PYTEST}\nstatus=$?\n"
        'python3 -c \'import json, sys; json.dump({"reward": float(sys.argv[1] == "0"), "tests": 1}, '
        f'open("{REWARD_JSON}", "w"))\' $status\n'
    ),
    "pytest with a reporter the script installs": TEMPLATE_TEST_SH,
}
MULTI_METRIC = (
    f"{PYTEST}\nstatus=$?\n"
    'python3 -c \'import json, sys; ok = float(sys.argv[1] == "0"); '
    f'json.dump({{"correctness": ok, "performance": ok / 2}}, open("{REWARD_JSON}", "w"))\' $status\n'
)
HONEST = "printf 'def add(a, b):\\n    return a + b\\n' > calc.py\n"
WRONG = "def add(a, b):\n    return a - b\n"
TRICKS = {
    "reward.txt linked to /dev/null": f"""
import os
try:
    if os.path.lexists({REWARD_TXT!r}):
        os.remove({REWARD_TXT!r})
    os.symlink("/dev/null", {REWARD_TXT!r})
except OSError as error:
    print("TRICK-REFUSED", error)
""",
    "reward.json = 1, reward.txt linked away": f"""
import os
open({REWARD_JSON!r}, "w").write('{{"reward": 1}}')
try:
    if os.path.lexists({REWARD_TXT!r}):
        os.remove({REWARD_TXT!r})
    os.symlink("/dev/null", {REWARD_TXT!r})
except OSError as error:
    print("TRICK-REFUSED", error)
""",
    "reward.txt = 1, then its process group killed": f"""
import os, signal
open({REWARD_TXT!r}, "w").write("1")
os.killpg(0, signal.SIGKILL)
""",
    "reward.txt = 1, then hung to the timeout": f"""
import time
open({REWARD_TXT!r}, "w").write("1")
time.sleep(3600)
""",
    "reward.txt = 1e300": f"""
open({REWARD_TXT!r}, "w").write("1e300")
""",
}
EXPECTED: dict[tuple[str, str], str | None] = {
    ("reward.txt linked to /dev/null", "root"): "reward_forged",
    ("reward.txt linked to /dev/null", "grader"): None,
    ("reward.json = 1, reward.txt linked away", "root"): "reward_forged",
    ("reward.json = 1, reward.txt linked away", "grader"): "reward_file",
    ("reward.txt = 1, then its process group killed", "root"): "verify_killed",
    ("reward.txt = 1, then hung to the timeout", "grader"): "verify_killed",
    ("reward.txt = 1e300", "root"): "reward_out_of_range",
}
"""Each trick as which identity, and the finding it must leave (None: the kernel refused it, nothing to find)."""
TRICK_STYLE = {"reward.txt = 1e300": "&& echo, no else"}
"""The pre-write tricks need a script that writes nothing on failure (an if/else script overwrites them)."""


def solve_sh(calc: str) -> str:
    return f"cat > calc.py <<'PY'\n{calc}PY\n"


def task_dir(root: Path, name: str, test_sh: str, solve: str, *, user: str | None, timeout_s: float = 120.0) -> Path:
    task = root / name
    for part in ("tests", "solution"):
        (task / part).mkdir(parents=True)
    (task / "instruction.md").write_text("Write add(a, b) in calc.py.\n")
    identity = f'user = "{user}"\n' if user else ""
    config = f"""\
        version = "1.1"
        [verifier]
        timeout_sec = {timeout_s}
        {identity}
        [environment]
        docker_image = "{build_base_image()}"
        """
    (task / "task.toml").write_text(textwrap.dedent(config))
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (task / "tests" / "test_outputs.py").write_text(TEST_OUTPUTS)
    (task / "solution" / "solve.sh").write_text(solve)
    return task


async def graded(task: Path, backend: LocalBackend, **overrides: object) -> RolloutResult:
    request = request_from_task_dir(task, oracle=True)
    result = await run_rollout(request.model_copy(update=overrides), backend)
    again = RolloutResult.model_validate_json(result.model_dump_json())
    assert again.integrity == result.integrity
    return result


def kinds(result: RolloutResult) -> set[str]:
    return {finding.kind for finding in result.integrity}


async def test_each_honest_test_sh_style_gets_one(backend: LocalBackend, tmp_path: Path, no_leaks: None) -> None:
    tasks = [task_dir(tmp_path, f"style{index}", text, HONEST, user=None) for index, text in enumerate(STYLES.values())]
    results = await asyncio.gather(*(graded(task, backend) for task in tasks))
    for style, result in zip(STYLES, results, strict=True):
        assert (result.status, result.reward) == ("completed", 1.0), (style, result.error, result.verify_results)
        assert not kinds(result), (style, result.integrity)
    assert results[2].reward_metrics == {"reward": 1.0, "tests": 1.0}


@pytest.mark.parametrize(("trick", "identity"), sorted(EXPECTED))
async def test_a_wrong_answer_plus_a_trick_on_the_reward_file_gets_zero(
    backend: LocalBackend, tmp_path: Path, no_leaks: None, trick: str, identity: str
) -> None:
    test_sh = STYLES[TRICK_STYLE.get(trick, "if/else echo")]
    timeout_s = 20.0 if "hung" in trick else 120.0
    task = task_dir(tmp_path, "trick", test_sh, solve_sh(WRONG + TRICKS[trick]), user=identity, timeout_s=timeout_s)
    result = await graded(task, backend)
    assert result.reward == 0.0, (result.status, result.error, result.verify_results)
    finding = EXPECTED[(trick, identity)]
    if finding is None:
        assert result.status == "completed", result.error
        assert "TRICK-REFUSED" in "".join(command.stdout for command in result.verify_results)
    else:
        assert (result.status, result.failed_phase) == ("agent_error", "verify"), result.error
        assert finding in kinds(result), result.integrity


@pytest.mark.parametrize(("verify_sandbox", "response"), [("same", "removed"), ("fresh", "not_carried")])
async def test_a_reward_the_agent_wrote_before_verify_is_removed_and_recorded(
    backend: LocalBackend, tmp_path: Path, no_leaks: None, verify_sandbox: str, response: str
) -> None:
    solve = solve_sh(WRONG) + f"echo 1 > {REWARD_TXT}\n"
    task = task_dir(tmp_path, "prewritten", STYLES["&& echo, no else"], solve, user=None)
    result = await graded(task, backend, verify_sandbox=verify_sandbox)
    assert (result.status, result.reward) == ("completed", 0.0), (result.error, result.verify_results)
    assert [(item.kind, item.response) for item in result.integrity] == [("reward_file", response)]


async def test_a_multi_metric_reward_json_keeps_every_metric_and_never_falls_back(
    backend: LocalBackend, tmp_path: Path, no_leaks: None
) -> None:
    """Harbor's multi-reward recipe: no `reward` key. Without the task naming one it is 0.0 with a finding (the exit
    status of a test.sh that ends well would have made doing nothing 1.0); naming one grades by it."""
    nothing = task_dir(tmp_path, "nothing", MULTI_METRIC, "true\n", user=None)
    honest = task_dir(tmp_path, "honest", MULTI_METRIC, HONEST, user=None)
    unnamed, named, named_nothing = await asyncio.gather(
        graded(honest, backend),
        graded(honest, backend, reward_key="correctness"),
        graded(nothing, backend, reward_key="correctness"),
    )
    assert (unnamed.reward, unnamed.status) == (0.0, "agent_error"), unnamed.error
    assert "reward_unparsable" in kinds(unnamed)
    assert unnamed.reward_metrics == {"correctness": 1.0, "performance": 0.5}
    assert (named.reward, named.status, named.reward_metrics["performance"]) == (1.0, "completed", 0.5), named.error
    assert (named_nothing.reward, named_nothing.status) == (0.0, "completed"), named_nothing.error


LINK_TRICK = """
import os, sys
try:
    os.remove("/home/user/logs/verifier/reward.txt")
    os.symlink("/dev/null", "/home/user/logs/verifier/reward.txt")
except OSError as error:
    print("TRICK-REFUSED", error, file=sys.stderr)
def add(a, b):
    return a - b
"""


async def test_the_link_attack_on_the_e2b_fake_gets_zero(fake_cloud: FakeCloud, no_leaks: None) -> None:
    (provider,) = [provider for provider in PROVIDERS if provider.name == "e2b"]
    backend = provider.backend(fake_cloud)
    solution = f"cat > add.py <<'PY'\n{LINK_TRICK}PY"
    request = RolloutRequest(instruction=DEMO_INSTRUCTION, solution=[solution], verify=DEMO_VERIFY, task_id="link")
    result = await run_rollout(request, backend)
    assert (result.status, result.reward) == ("completed", 0.0), (result.error, result.verify_results)
    assert "TRICK-REFUSED" in "".join(command.stderr for command in result.verify_results)


async def test_a_400_digit_reward_is_zero_with_a_finding_not_an_internal_error(
    backend: LocalBackend, tmp_path: Path, no_leaks: None
) -> None:
    """float() of a 400-digit JSON integer raised OverflowError in the host: the rollout ended internal_error with
    no reward, turning a 0.0 into "our failure, do not train"."""
    huge = "1" * 400
    task = task_dir(tmp_path, "huge", f"echo '{{\"reward\": {huge}}}' > {REWARD_JSON}\n", HONEST, user=None)
    result = await graded(task, backend)
    assert (result.status, result.reward) == ("agent_error", 0.0), (result.error, result.verify_results)
    assert "reward_out_of_range" in kinds(result)


LOGS_BREAKAGES = (
    "mv /home/user/logs /home/user/logs.old && ln -s /tmp /home/user/logs",
    "rm -rf /home/user/logs/verifier && ln -s /etc /home/user/logs/verifier",
    "rm -rf /home/user/logs && echo x > /home/user/logs",
)


async def test_an_agent_that_breaks_the_logs_dir_still_gets_its_honest_reward(
    backend: LocalBackend, no_leaks: None
) -> None:
    """The hand-over makes the channel anew whatever the agent left on its path (graded in the agent's box)."""
    right = "printf 'def add(a, b):\\n    return a + b\\n' > /home/user/workdir/add.py"
    requests = [
        RolloutRequest(
            instruction=DEMO_INSTRUCTION,
            solution=[right, breakage],
            verify=DEMO_VERIFY,
            verify_sandbox="same",
            task_id="break",
        )
        for breakage in LOGS_BREAKAGES
    ]
    results = await asyncio.gather(*(run_rollout(request, backend) for request in requests))
    for breakage, result in zip(LOGS_BREAKAGES, results, strict=True):
        assert (result.status, result.reward, result.reward_source) == ("completed", 1.0, "reward_txt"), (
            breakage,
            result.error,
            result.verify_results,
        )


async def test_a_verify_the_deadline_cut_short_carries_no_grade(backend: LocalBackend, no_leaks: None) -> None:
    """A verify command that needs its 30 s gets what the rollout's 15 s deadline leaves: a timeout (no reward, never
    trained), not the policy's 0.0 a verify that was killed would be."""
    right = "printf 'def add(a, b):\\n    return a + b\\n' > /home/user/workdir/add.py"
    request = RolloutRequest(
        instruction=DEMO_INSTRUCTION,
        solution=[right],
        verify=["sleep 30; " + " && ".join(DEMO_VERIFY)],
        verify_timeout_s=30,
        total_timeout_s=15,
        task_id="cut",
    )
    result = await run_rollout(request, backend)
    assert (result.status, result.failed_phase, result.reward) == ("timeout", "verify", None), result.error
    assert [item.timed_out for item in result.verify_results] == [True]
    assert not any(item.kind == "verify_killed" for item in result.integrity)
