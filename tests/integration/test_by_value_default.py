"""By value as the default: a task that does not name a test mode (`auto`) is graded by value when its tests have the
shape by value serves, decided from the tests before anything runs. A RIGHT answer that sabotages the channel to its
own process (kills it, writes garbage on its socket, closes its descriptors, exits mid-call) scores 0.0 with a
`by_value_broken` finding, even when the tests that ran before the break passed (scoring `fraction`), and is never
graded again in process. Real pipeline, base image, local backend, grader's box."""

from __future__ import annotations

import pytest

from opencode_env.rollout.check_task import check_task
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_check_task_mutants import ANYTHING
from tests.integration.test_grader_integrity import base_image, shell_file
from tests.integration.test_test_grader_isolation import ADD, GRADED, WORKDIR

AUTO = {key: value for key, value in GRADED.items() if key != "mode"}

SOCKETS = """\
import os, stat


def sockets():
    found = []
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                found.append(fd)
        except OSError:
            pass
    return found
"""
SABOTAGE = {
    "kills its own process": "import signal\n        os.kill(os.getpid(), signal.SIGKILL)",
    "writes garbage on the wire": "for fd in sockets():\n            os.write(fd, b'\\xff\\xfe no frame \\x00' * 64)",
    "closes its descriptors": "for fd in sockets():\n            os.close(fd)",
    "exits mid-call": "os._exit(0)",
}


def sabotaging_add(sabotage: str) -> str:
    """A right add() that breaks the channel on its last graded call, add(0, 0)."""
    return f"{SOCKETS}\n\ndef add(a, b):\n    if (a, b) == (0, 0):\n        {sabotage}\n    return a + b\n"


@pytest.fixture(scope="module")
def image() -> str:
    return base_image()


def auto_task(image: str, solution: list[str], **tests: object) -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            "instruction": "Write add.py with add(a, b) returning a + b.",
            "image": image,
            "tests": {**AUTO, "call_timeout_s": 5, **tests},
            "solution": solution,
            "task_id": "add-auto",
        }
    )


def pytest_runs(result: RolloutResult) -> int:
    return sum("pytest-runner" in step.cmd for step in result.verify_results)


async def test_auto_grades_plain_tests_by_value(backend: LocalBackend, no_leaks: None, image: str) -> None:
    result = await run_rollout(auto_task(image, [shell_file(f"{WORKDIR}/add.py", ADD)]), backend)
    assert result.task is not None
    assert result.task.tests is not None
    assert result.task.tests.mode == "auto"
    assert (result.test_mode, result.status, result.reward) == ("by_value", "completed", 1.0), result.error
    assert "only through plain values" in result.test_mode_reason
    assert any("by_value_server" in step.cmd for step in result.verify_results)
    assert result.integrity == []


@pytest.mark.parametrize("sabotage", sorted(SABOTAGE))
async def test_sabotaging_the_channel_is_the_agents_zero(
    backend: LocalBackend, no_leaks: None, image: str, sabotage: str
) -> None:
    solution = [shell_file(f"{WORKDIR}/add.py", sabotaging_add(SABOTAGE[sabotage]))]
    result = await run_rollout(auto_task(image, solution, scoring="fraction"), backend)
    assert result.test_mode == "by_value", result.test_mode_reason
    assert result.reward == 0.0, (result.test_outcomes, result.verify_results)
    assert (result.status, result.failed_phase) == ("agent_error", "verify"), result.error
    (finding,) = [item for item in result.integrity if item.kind == "by_value_broken"]
    assert (finding.act, finding.response) == ("forged", "graded_zero")
    assert "by-value channel" in (result.error or "")
    assert pytest_runs(result) == 1, "never graded again in process"


async def test_check_task_names_the_declaration_when_auto_chooses_wrong(
    backend: LocalBackend, no_leaks: None, image: str
) -> None:
    """The tests' text reads like plain values (`ANYTHING == 5`), but the reference's ANYTHING is an object whose
    `__eq__` says yes: by value the oracle fails, in process it passes, and check-task says what to declare."""
    request = RolloutRequest.model_validate(
        {
            "instruction": "Write anything.py with ANYTHING, a value equal to every value.",
            "image": image,
            "tests": {
                "files": {
                    "test_any.py": "from anything import ANYTHING\n\n\ndef test_equal():\n    assert ANYTHING == 5\n"
                },
                "fail_to_pass": ["test_any.py::test_equal"],
                "unmutated": ["test_any.py::test_equal"],
            },
            "solution": [shell_file(f"{WORKDIR}/anything.py", ANYTHING)],
            "task_id": "anything-auto",
        }
    )
    check = await check_task(request, backend)
    assert check.choice is not None
    assert (check.choice.mode, check.choice.declared) == ("by_value", False)
    assert check.oracle is not None
    assert check.oracle.reward == 0.0
    assert check.other_mode is not None
    assert check.other_mode.reward == 1.0
    assert check.verdict == "broken"
    assert "declare tests.mode ([verifier.tests] mode in a Harbor task) = 'in_process'" in check.reason


PRIMES_TESTS = """\
from primes import is_prime


def test_primes():
    assert all(map(is_prime, [2, 3, 5, 7, 11, 13]))


def test_composites():
    assert not any(map(is_prime, [1, 4, 6, 8, 9, 15]))
"""
IS_PRIME = {
    "right": ("def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n", 1.0),
    "raises StopIteration": ("def is_prime(n):\n    raise StopIteration\n", 0.0),
    "raises its own StopIteration": (
        "class Done(StopIteration):\n    pass\n\n\ndef is_prime(n):\n    raise Done\n",
        0.0,
    ),
}


@pytest.mark.parametrize("solution", sorted(IS_PRIME))
async def test_what_the_code_raises_never_ends_the_tests_iteration(
    backend: LocalBackend, no_leaks: None, image: str, solution: str
) -> None:
    """Tests that hand the code's function to `map` are graded by value; a wrong is_prime that raises StopIteration
    would end the tests' map at once (`all` of nothing is True) if it crossed as itself: it crosses as a
    RuntimeError, as Python makes it inside a generator, and scores 0."""
    source, reward = IS_PRIME[solution]
    request = RolloutRequest.model_validate(
        {
            "instruction": "Write primes.py with is_prime(n).",
            "image": image,
            "tests": {
                "files": {"test_primes.py": PRIMES_TESTS},
                "fail_to_pass": ["test_primes.py::test_primes", "test_primes.py::test_composites"],
                "call_timeout_s": 5,
            },
            "solution": [shell_file(f"{WORKDIR}/primes.py", source)],
            "task_id": "primes-auto",
        }
    )
    result = await run_rollout(request, backend)
    assert result.test_mode == "by_value", result.test_mode_reason
    assert (result.status, result.reward) == ("completed", reward), (result.error, result.test_outcomes)
