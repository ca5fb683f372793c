"""How many of our tasks the test grader can run by value, and what `auto` (the default) picks for them: each task's
oracle graded in process and by value, side by side, and doing nothing graded as auto picks. A task already graded
by tests runs with its mode set to auto; one whose verify runs pytest over handed test files (a JSON task's
`verify_files`, a Harbor task's tests/test_*.py) is converted to the test grader (every test function of those files
expected to pass) and marked so; any other is graded by a script or by output, where by value does not apply.

    uv run python bench/by_value_reach.py examples/task_add_tests.json examples/audit/*.json examples/harbor/* \
        tests/harbor_corpus/*/
"""

from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path

from opencode_env.cli.check_task import _task_request
from opencode_env.rollout.grading.test_shape import choose_mode
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.wire import RolloutRequest

TEST_FILE = ("test_", "_test.py")


def test_ids(path: str, source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    ids = [
        f"{path}::{node.name}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
    ]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            ids += [
                f"{path}::{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test")
            ]
    return ids


def as_test_grader(request: RolloutRequest) -> RolloutRequest | None:
    """The request graded by the test grader: itself, or converted from pytest over handed test files (None: no
    such files)."""
    if request.tests is not None:
        return request
    handed = {
        path: text
        for path, text in request.verify_files.items()
        if path.rsplit("/", 1)[-1].startswith(TEST_FILE[0]) or path.endswith(TEST_FILE[1])
    }
    if not handed or not any("pytest" in command for command in [*request.verify, *request.verify_files.values()]):
        return None
    files = {path.rsplit("/", 1)[-1]: text for path, text in request.verify_files.items() if path.endswith(".py")}
    ids = [test_id for path, text in handed.items() for test_id in test_ids(path.rsplit("/", 1)[-1], text)]
    if not ids:
        return None
    tests = {"files": files, "fail_to_pass": ids}
    return request.model_copy(
        update={
            "tests": RolloutRequest.model_validate({**request.model_dump(), "tests": tests}).tests,
            "verify": [],
            "verify_files": {},
        }
    )


async def main(paths: list[str]) -> None:
    backend = LocalBackend(cached_tools)
    applies = graded = picked = kept = 0
    print("| task | graded by | auto picks | oracle in process | oracle by value | nothing, as auto picks |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in paths:
        request = _task_request(Path(path))
        converted = as_test_grader(request)
        if converted is None:
            print(f"| {path} | a script or output | - | - | - | - |", flush=True)
            continue
        graded += 1
        how = "tests" if request.tests is not None else "pytest (converted)"
        assert converted.tests is not None
        auto = converted.model_copy(update={"tests": converted.tests.model_copy(update={"mode": "auto"})})
        assert auto.tests is not None
        pick = choose_mode(auto.tests).mode
        rewards = {}
        for mode in ("in_process", "by_value"):
            run = converted.model_copy(update={"tests": converted.tests.model_copy(update={"mode": mode})})
            result = await run_rollout(run, backend)
            rewards[mode] = f"{result.reward} {result.status}"
        nothing = await run_rollout(auto.model_copy(update={"solution": []}), backend)
        applies += rewards["by_value"].startswith("1.0")
        picked += pick == "by_value"
        kept += rewards[pick].startswith("1.0") and nothing.reward == 0.0
        print(
            f"| {path} | {how} | {pick} | {rewards['in_process']} | {rewards['by_value']} | "
            f"{nothing.reward} {nothing.status} |",
            flush=True,
        )
    print(
        f"\n{applies} of {graded} tasks graded by tests pass by value; auto picks by value for {picked}; "
        f"{kept} of {graded} keep oracle 1.0 and nothing 0.0 as auto picks; {len(paths) - graded} are graded otherwise"
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
