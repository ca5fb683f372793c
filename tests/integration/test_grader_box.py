"""The grade comes from a box the agent never touched: issue 47's attacks through the real pipeline.

The task of test_grader_integrity (tests handed over inside the work dir, verify runs `git status` and pytest from
there, setup makes a git repository) graded by default in the grader's box. An oracle run plays the hostile agent:
a WRONG add.py (or none) plus one trick. Each must get 0.0 with a policy status and a finding naming what was not
carried; the honest add.py gets 1.0; a work dir past a cap of the copy is graded 0 as the agent's outcome.
"""

from __future__ import annotations

import pytest

from opencode_env.rollout.grading.grader_box import CARRY_LIMITS
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_grader_integrity import (
    ADD,
    EXIT_EARLY,
    MAKEREPORT,
    PLUGIN_METADATA,
    REWARD,
    WORKDIR,
    WRONG_ADD,
    base_image,
    graded,
    shell_file,
    task,
)

FORCE_PASS_HOOK = "import sys; sys.modules.setdefault('zz_force', None)\n"
HOSTILE_GIT = f'[filter "x"]\n\tclean = sh -c "echo 1 > {REWARD}; cat"\n\tsmudge = cat\n'
ATTACKS: dict[str, tuple[list[str], str, str]] = {
    "a symlink out of the work dir to a right answer": (
        [shell_file("/tmp/elsewhere/add.py", ADD), "rm -f add.py && ln -s /tmp/elsewhere/add.py add.py"],
        "add.py",
        "link",
    ),
    "a link to a conftest hidden in .git": (
        [shell_file(".git/x/conftest.py", EXIT_EARLY), "mkdir -p tests && ln -s ../.git/x tests/zzz"],
        "tests/zzz",
        "link",
    ),
    "a FIFO": (["mkfifo pipe"], "pipe", "special_file"),
    "a hard link": (["ln add.py add_copy.py"], "add_copy.py", "hard_link"),
    "a .git with a hostile commondir and a filter": (
        [
            shell_file("/tmp/common/config", HOSTILE_GIT),
            "echo /tmp/common > .git/commondir",
            "echo '* filter=x' > .gitattributes",
        ],
        ".git",
        "git_config",
    ),
    "an upper-case dist-info with a pytest11 entry point": (
        [
            shell_file("Evil.DIST-INFO/entry_points.txt", "[pytest11]\nzz_plugin = zz_plugin\n"),
            shell_file("Evil.DIST-INFO/METADATA", PLUGIN_METADATA),
            shell_file("zz_plugin.py", MAKEREPORT),
        ],
        "Evil.DIST-INFO",
        "package_metadata",
    ),
    "a .pth": (
        [shell_file("zz.PTH", "import zz_force\n"), shell_file("zz_force.py", FORCE_PASS_HOOK)],
        "zz.PTH",
        "startup_hook",
    ),
    "pytest.ini and conftest.py in HOME": (
        [shell_file("/home/user/pytest.ini", "[pytest]\n"), shell_file("/home/user/conftest.py", MAKEREPORT)],
        "../conftest.py",
        "outside_work_dir",
    ),
    "the work dir 0311 with addopts --co": (
        [shell_file("pytest.ini", "[pytest]\naddopts = --co\n"), f"chmod 0311 {WORKDIR}"],
        "pytest.ini",
        "test_config",
    ),
}


@pytest.fixture(scope="module")
def image() -> str:
    return base_image()


def wrong_with(steps: list[str]) -> list[str]:
    return [shell_file(f"{WORKDIR}/add.py", WRONG_ADD), *(f"cd {WORKDIR} && {step}" for step in steps)]


def finding(result: RolloutResult, path: str) -> tuple[str, str]:
    found = {item.path: (item.kind, item.response) for item in result.integrity}
    assert path in found, result.integrity
    return found[path]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_wrong_answer_plus_a_trick_gets_zero_in_the_grader_box(
    backend: LocalBackend, no_leaks: None, image: str, attack: str
) -> None:
    steps, path, kind = ATTACKS[attack]
    result = await graded(task(image, wrong_with(steps)), backend)
    assert [step.exit_code for step in result.solution_results] == [0] * len(result.solution_results)
    assert result.grade_isolation == "fresh_box"
    assert result.reward == 0.0, (result.verify_results, result.integrity)
    assert finding(result, path)[0] == kind


async def test_the_honest_answer_gets_one_in_the_grader_box(backend: LocalBackend, no_leaks: None, image: str) -> None:
    honest = [shell_file(f"{WORKDIR}/add.py", ADD), f"chmod 0755 {WORKDIR}/add.py"]
    result = await graded(task(image, honest), backend)
    assert (result.reward, result.grade_isolation) == (1.0, "fresh_box"), result.verify_results
    assert [item for item in result.integrity if item.kind != "bytecode"] == []
    assert "work dir copied in" in result.enforcement["verify"]


async def test_a_declared_solution_file_is_carried(backend: LocalBackend, no_leaks: None, image: str) -> None:
    """A task whose solution is a .pth (declared in solution_files) gets it in the grader's box."""
    solution = [shell_file(f"{WORKDIR}/add.py", ADD), shell_file(f"{WORKDIR}/site.pth", "# the agent's\n")]
    check = f"test -f {WORKDIR}/site.pth && test ! -e {WORKDIR}/other.pth"
    solution.append(shell_file(f"{WORKDIR}/other.pth", "x\n"))
    request = checked(task(image, solution, solution_files=["site.pth"]), check)
    result = await graded(request, backend)
    assert result.reward == 1.0, result.verify_results
    assert finding(result, "other.pth") == ("startup_hook", "not_carried")
    assert finding(result, "site.pth") == ("startup_hook", "kept")


CAPS = {
    "bytes": f"truncate -s {CARRY_LIMITS.max_bytes + 2**20} big.bin",
    "entries": f"mkdir many && cd many && seq {CARRY_LIMITS.max_entries + 1} | xargs touch",
    "depth": f"mkdir -p $(printf 'd/%.0s' $(seq {CARRY_LIMITS.max_depth + 1}))",
    "path length": "mkdir -p $(python3 -c \"print('/'.join(['a' * 250] * 20))\")",
}


@pytest.mark.parametrize("cap", sorted(CAPS))
async def test_a_work_dir_past_a_cap_is_the_agents_outcome(
    backend: LocalBackend, no_leaks: None, image: str, cap: str
) -> None:
    """Even with the right add.py: a tree the copy cannot carry whole is graded 0, never an infrastructure failure."""
    solution = [shell_file(f"{WORKDIR}/add.py", ADD), f"cd {WORKDIR} && {CAPS[cap]}"]
    result = await graded_refused(task(image, solution), backend)
    assert finding(result, ".") == ("over_limit", "refused")


async def graded_refused(request: RolloutRequest, backend: LocalBackend) -> RolloutResult:
    result = await run_rollout(request, backend)
    assert [step.exit_code for step in result.solution_results] == [0] * len(result.solution_results)
    assert (result.status, result.failed_phase, result.reward) == ("agent_error", "verify", 0.0), result.error
    assert "past a cap" in (result.error or "")
    return result


async def test_the_agents_box_is_named_when_the_task_asks_for_it(
    backend: LocalBackend, no_leaks: None, image: str
) -> None:
    """A task that grades more than files (here: a link the agent made, which the copy does not carry) declares
    verify_sandbox='same'. (What the agent leaves in HOME or above the work dir is no such state: verify sees none
    of it in either box, test_grader_edges.py.)"""
    solution = [shell_file(f"{WORKDIR}/add.py", ADD), f"ln -s add.py {WORKDIR}/plus.py"]
    check = f"test -L {WORKDIR}/plus.py"
    result = await graded(checked(task(image, solution, verify_sandbox="same"), check), backend)
    assert (result.reward, result.grade_isolation) == (1.0, "agent_box"), result.verify_results
    fresh = await graded(checked(task(image, solution), check), backend)
    assert (fresh.reward, fresh.grade_isolation) == (0.0, "fresh_box")


def checked(request: RolloutRequest, check: str) -> RolloutRequest:
    """The task's one verify command run only after `check` passes (the reward is verify's pass rate)."""
    return request.model_copy(update={"verify": [f"{check} && {{ {request.verify[0]}; }}"]})
