"""check-task drops a mutant tripwire the reference solution passes: a test whose `==` holds for more than one
expected value (here a value equal to everything) would otherwise flag the oracle as a forger."""

from __future__ import annotations

import json

from opencode_env.rollout.check_task import check_task
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.wire import RolloutRequest
from tests.integration.test_grader_integrity import shell_file
from tests.integration.test_test_grader_isolation import WORKDIR, image

__all__ = ["image"]

ANYTHING = "class _Anything:\n    def __eq__(self, other):\n        return True\n\n\nANYTHING = _Anything()\n"
TESTS = {
    "files": {
        "test_any.py": "from anything import ANYTHING\n\n\ndef test_equal():\n    assert ANYTHING == 5\n",
    },
    "fail_to_pass": ["test_any.py::test_equal"],
    "mode": "in_process",
}


async def test_check_task_drops_a_mutant_the_oracle_passes(backend: LocalBackend, no_leaks: None, image: str) -> None:
    request = RolloutRequest.model_validate(
        {
            "instruction": "Write anything.py with ANYTHING, a value equal to every value.",
            "image": image,
            "tests": TESTS,
            "solution": [shell_file(f"{WORKDIR}/anything.py", ANYTHING)],
            "task_id": "anything",
        }
    )
    check = await check_task(request, backend)
    assert (check.verdict, check.oracle.reward, check.oracle.integrity) == ("ok", 1.0, []), check.reason
    assert not check.by_value_applies, "a value equal to everything cannot cross by value"
    (warning,) = [item for item in check.warnings if "tests.unmutated" in item]
    assert json.dumps(["test_any.py::test_equal"]) in warning
