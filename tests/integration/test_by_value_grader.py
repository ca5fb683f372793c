"""The test grader by value: the code under test runs in its own process under the agent's identity and the tests
reach it only through plain data. Each attack is a WRONG add.py plus one trick, an oracle run through the real
pipeline in the base image (graded in the grader's box, the default): each must score 0.0; the honest add.py 1.0.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from opencode_env.rollout.check_task import check_task
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import VERIFIER_DIR
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.sandbox.cloud.hf import HFBackend
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.testing.fake_e2b import FakeCloud
from opencode_env.testing.fake_hf import FAKE_TOOLS_DIR, FakeHfCloud
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_grader_integrity import base_image, shell_file
from tests.integration.test_test_grader_isolation import ADD, FORGERIES, GRADED, WORKDIR, WRONG_ADD

EQ_TRUE = """\
class Anything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def add(a, b):
    return Anything()
"""
RUNTEST_PATCHED = f"""\
import _pytest.python

_pytest.python.Function.runtest = lambda self: None
{WRONG_ADD}"""
BUILTINS_PATCHED = f"""\
import builtins, sys

builtins.AssertionError = type("AssertionError", (Exception,), {{}})
sys.modules["pytest"] = None
{WRONG_ADD}"""
OS_EXIT_AT_IMPORT = "import os\nos._exit(0)\n"
ENDLESS = "def add(a, b):\n    while True:\n        pass\n"
HUGE = "def add(a, b):\n    return 'x' * (64 * 2**20)\n"
HELPER_SWAPPED = f"""\
import helper

helper.check = lambda add: None
{WRONG_ADD}"""
SITECUSTOMIZE = "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"
CONFTEST = "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n    return True\n"

REACH = f"""\
import os, stat, sys

def replaceable(path):
    parent = os.path.dirname(path)
    if parent == path or not os.access(parent, os.W_OK):
        return False
    sticky = os.stat(parent).st_mode & stat.S_ISVTX
    return not sticky or os.lstat(path).st_uid == os.getuid()

targets, inner = set(), set()
for root in ["{VERIFIER_DIR}", *[path for path in sys.path if path and os.path.isdir(path)]]:
    inner.add(root)
    path = root
    while path != os.path.dirname(path):
        targets.add(path)
        path = os.path.dirname(path)
    if root.startswith("{VERIFIER_DIR}"):
        for directory, _, names in os.walk(root):
            inner.add(directory)
            inner.update(os.path.join(directory, name) for name in names)
targets |= inner
reached = [path for path in targets if replaceable(path)]
reached += [path for path in inner if os.access(path, os.W_OK)]
for path in sorted(inner):
    if os.path.isdir(path):
        try:
            open(os.path.join(path, ".by-value-probe"), "x").close()
            reached.append(path)
        except OSError:
            pass
try:
    os.rename("{VERIFIER_DIR}", "{VERIFIER_DIR}-moved")
    reached.append("renamed the verifier directory")
except OSError:
    pass
print("checked", len(targets), "paths; reached:", sorted(set(reached)), flush=True)
{WRONG_ADD}"""

ATTACKS: dict[str, list[str]] = {
    "a result whose __eq__ returns True": [shell_file(f"{WORKDIR}/add.py", EQ_TRUE)],
    "pytest patched at import": [shell_file(f"{WORKDIR}/add.py", RUNTEST_PATCHED)],
    "builtins and sys.modules patched at import": [shell_file(f"{WORKDIR}/add.py", BUILTINS_PATCHED)],
    "a conftest.py in the work dir": [
        shell_file(f"{WORKDIR}/add.py", WRONG_ADD),
        shell_file(f"{WORKDIR}/conftest.py", CONFTEST),
    ],
    "a sitecustomize.py in the work dir": [
        shell_file(f"{WORKDIR}/add.py", WRONG_ADD),
        shell_file(f"{WORKDIR}/sitecustomize.py", SITECUSTOMIZE),
    ],
    "the tests' helper replaced in memory": [shell_file(f"{WORKDIR}/add.py", HELPER_SWAPPED)],
    "os._exit(0) at import": [shell_file(f"{WORKDIR}/add.py", OS_EXIT_AT_IMPORT)],
    "an endless loop": [shell_file(f"{WORKDIR}/add.py", ENDLESS)],
    "a 64 MiB result": [shell_file(f"{WORKDIR}/add.py", HUGE)],
    **{f"in-process forgery: {name}": steps for name, steps in FORGERIES.items()},
}


BREAKS_THE_CHANNEL = {"os._exit(0) at import", "an endless loop"}
"""By value the code's process dies or stops answering: the grade is 0 with a `by_value_broken` finding."""


@pytest.fixture(scope="module")
def image() -> str:
    return base_image()


def by_value_task(image: str | None, solution: list[str], **fields: object) -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            **fields,
            "instruction": "Write add.py with add(a, b) returning a + b.",
            **({"image": image} if image else {}),
            "tests": {**GRADED, "mode": "by_value", "call_timeout_s": 5},
            "solution": solution,
            "task_id": "add-by-value",
        }
    )


def outcomes(result: RolloutResult) -> list[str]:
    return [test.outcome for test in result.test_outcomes]


async def test_the_honest_answer_scores_one(backend: LocalBackend, no_leaks: None, image: str) -> None:
    result = await run_rollout(by_value_task(image, [shell_file(f"{WORKDIR}/add.py", ADD)]), backend)
    assert (result.status, result.reward) == ("completed", 1.0), (result.error, result.verify_results)
    assert outcomes(result) == ["passed", "passed"]
    assert result.integrity == []


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_wrong_answer_with_a_trick_scores_zero(
    backend: LocalBackend, no_leaks: None, image: str, attack: str
) -> None:
    result = await run_rollout(by_value_task(image, ATTACKS[attack]), backend)
    assert result.reward == 0.0, (result.verify_results, result.test_outcomes)
    broke = [finding for finding in result.integrity if finding.kind == "by_value_broken"]
    if attack in BREAKS_THE_CHANNEL:
        assert broke, (result.integrity, result.verify_results)
        assert (result.status, result.failed_phase) == ("agent_error", "verify"), result.error
    else:
        assert (result.status, broke) == ("completed", []), (result.error, result.verify_results)
    assert "passed" not in outcomes(result)[:1], result.verify_results


BY_PATH = f"""\
import runpy
import subprocess
import sys

import pytest

sys.path.insert(0, {WORKDIR!r})
from add import add


def test_add():
    assert add(2, 3) == 5


def test_no_file_of_the_work_dir_runs_here():
    with pytest.raises(Exception):
        runpy.run_path({WORKDIR!r} + "/add.py")
    ran = subprocess.run([sys.executable, {WORKDIR!r} + "/add.py"], capture_output=True)
    assert ran.returncode != 0
"""


@pytest.mark.parametrize(("verify_sandbox", "verify_as"), [("fresh", "grader"), ("same", "grader"), ("fresh", "root")])
async def test_tests_that_put_the_work_dir_on_their_path_still_reach_it_by_value(
    backend: LocalBackend, no_leaks: None, image: str, verify_sandbox: str, verify_as: str
) -> None:
    """Harbor's tests add the work dir to sys.path themselves (`sys.path.insert(0, "/app")`): the module is still a
    stand-in (a path in the work dir finds nothing), so an answer equal to everything scores 0, the honest one 1,
    also for a root grader (Harbor's default). For a grader that is not root the work dir is sealed too: no route
    (runpy, a subprocess) runs a file of it in the tests' process."""
    sealed = verify_as == "grader"
    tests = {
        "files": {"test_path.py": BY_PATH},
        "fail_to_pass": ["test_path.py::test_add"],
        "pass_to_pass": ["test_path.py::test_no_file_of_the_work_dir_runs_here"] if sealed else [],
    }
    for source, reward in ((EQ_TRUE, 0.0), (ADD, 1.0)):
        steps = [shell_file(f"{WORKDIR}/add.py", source)]
        request = by_value_task(image, steps, verify_sandbox=verify_sandbox, verify_as=verify_as)
        assert request.tests is not None
        request = request.model_copy(update={"tests": request.tests.model_copy(update=tests)})
        result = await run_rollout(request, backend)
        assert (result.status, result.reward) == ("completed", reward), (result.error, result.verify_results)
        assert outcomes(result)[1:] == (["passed"] if sealed else []), result.verify_results


@pytest.mark.parametrize("verify_sandbox", ["fresh", "same"])
async def test_the_code_under_test_can_write_nothing_the_tests_read(
    backend: LocalBackend, no_leaks: None, image: str, verify_sandbox: str
) -> None:
    """A walker in the code under test's process, over every path the tests' process reads from (the verifier
    directory and all under it, every directory on the path and their ancestors): it can create, change or rename
    none of them, in the grader's box or in the agent's."""
    steps = [shell_file(f"{WORKDIR}/add.py", REACH)]
    result = await run_rollout(by_value_task(image, steps, verify_sandbox=verify_sandbox), backend)
    (served,) = [step for step in result.verify_results if "by_value_server" in step.cmd]
    assert "; reached: []" in served.stdout, served.stdout
    assert int(served.stdout.split("checked ", 1)[1].split()[0]) > 10, served.stdout
    assert result.reward == 0.0, (result.verify_results, result.test_outcomes)


@pytest.mark.timeout(900)  # four rollouts, each a cloud VM and its grader's VM: 120 s at load 12
@pytest.mark.parametrize("cloud", ["e2b", "hf"])
async def test_the_cloud_backends_grade_by_value_alike(
    fake_cloud: FakeCloud, hf_cloud: FakeHfCloud, leak_check: Callable[[], None], cloud: str
) -> None:
    """The same server through a cloud VM's root: the honest answer 1.0; a result equal to everything, the tests'
    helper swapped in memory and a walker after the tests' paths each get nothing."""
    backend = (
        E2BBackend(sandbox_class=fake_cloud.sandbox_class(), api_key=fake_cloud.api_key)
        if cloud == "e2b"
        else HFBackend(
            sandbox_class=hf_cloud.sandbox_class(), token=hf_cloud.token, image="opencode-env", tools_dir=FAKE_TOOLS_DIR
        )
    )
    honest = await run_rollout(by_value_task(None, [shell_file(f"{WORKDIR}/add.py", ADD)]), backend)
    assert (honest.status, honest.reward) == ("completed", 1.0), (honest.error, honest.verify_results)
    for attack in ("a result whose __eq__ returns True", "the tests' helper replaced in memory"):
        result = await run_rollout(by_value_task(None, ATTACKS[attack]), backend)
        assert (result.status, result.reward) == ("completed", 0.0), (attack, result.error, result.verify_results)
    reach = await run_rollout(by_value_task(None, [shell_file(f"{WORKDIR}/add.py", REACH)]), backend)
    (served,) = [step for step in reach.verify_results if "by_value_server" in step.cmd]
    assert "; reached: []" in served.stdout, served.stdout
    leak_check()


async def test_check_task_says_when_the_oracle_passes_by_value(
    backend: LocalBackend, no_leaks: None, image: str
) -> None:
    request = by_value_task(image, [shell_file(f"{WORKDIR}/add.py", ADD)])
    assert request.tests is not None
    in_process = request.model_copy(update={"tests": request.tests.model_copy(update={"mode": "in_process"})})
    check = await check_task(in_process, backend)
    assert check.verdict == "ok", check.reason
    assert check.other_mode is not None
    assert check.choice is not None
    assert (check.choice.mode, check.choice.declared) == ("in_process", True)
    assert check.by_value_applies, check.other_mode.verify_results
    assert any("declare tests.mode" in warning and "'by_value'" in warning for warning in check.warnings)
