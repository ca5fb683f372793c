"""How much of a task's grading the tripwires cover, and how much could run out of the code's reach, over the graded
tasks this repository has (examples/, the test fixtures, the Harbor example's tests as if every test were graded).

    uv run python -m bench.tripwire_coverage

Per task: its graded tests; those the grader's copy gives a mutant (the forger's escape is 2^-k over the failing
ones among them); and those whose every statement is `assert <call with literal arguments> == <literal>`, the shape
a by-value mode could run as a call in a process of its own returning JSON (issue 52, item 4: measured, not built).
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

from opencode_env.rollout.grading.graded_tests import make_canaries
from opencode_env.wire.grading import GradedTests

ROOT = Path(__file__).resolve().parents[1]


def tasks() -> dict[str, GradedTests]:
    from tests.integration import test_grader_integrity, test_grader_property, test_test_grader_isolation
    from tests.integration.test_check_task_mutants import TESTS as ANYTHING
    from tests.integration.test_tripwire_forger import TESTS as TWELVE

    found = {
        "examples/task_add_tests.json": json.loads((ROOT / "examples" / "task_add_tests.json").read_text())["tests"],
        "test_test_grader_isolation.GRADED": test_test_grader_isolation.GRADED,
        "test_grader_integrity.GRADED": test_grader_integrity.GRADED,
        "test_grader_property.GRADED": test_grader_property.GRADED,
        "test_tripwire_forger.TESTS": TWELVE,
        "test_check_task_mutants.TESTS": ANYTHING,
        "test_harbor_graded_tests (graded-calc)": {
            "files": {
                "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                "def test_add_negative():\n    assert add(-2, -3) == -5\n"
            },
            "fail_to_pass": ["test_calc.py::test_add", "test_calc.py::test_add_negative"],
        },
    }
    for task in sorted((ROOT / "examples" / "harbor").iterdir()):
        files = {path.name: path.read_text() for path in sorted((task / "tests").glob("test_*.py"))}
        ids = [f"{name}::{node.name}" for name, source in files.items() for node in _functions(source)]
        found[f"examples/harbor/{task.name} (every test)"] = {"files": files, "fail_to_pass": ids}
    return {name: GradedTests.model_validate(spec) for name, spec in found.items()}


def _functions(source: str) -> list[ast.FunctionDef]:
    return [
        node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
    ]


def by_value(source: str, name: str) -> bool:
    """Every statement asserts that a call on literals equals a literal."""
    node = next(item for item in _functions(source) if item.name == name)
    return all(_call_equals_literal(statement) for statement in node.body)


def _call_equals_literal(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Assert) or not isinstance(statement.test, ast.Compare):
        return False
    compare = statement.test
    if len(compare.ops) != 1 or not isinstance(compare.ops[0], ast.Eq):
        return False
    sides = [compare.left, compare.comparators[0]]
    calls = [side for side in sides if isinstance(side, ast.Call)]
    if len(calls) != 1:
        return False
    arguments = [*calls[0].args, *(keyword.value for keyword in calls[0].keywords)]
    return all(_literal(item) for item in arguments) and any(_literal(side) for side in sides if side is not calls[0])


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def main() -> None:
    rows = []
    for name, spec in tasks().items():
        copy = make_canaries(spec, random.Random(0))
        ids = list(dict.fromkeys([*spec.fail_to_pass, *spec.pass_to_pass]))
        mutated = len({test_id for test_id, _ in copy.twins})
        simple = 0
        for test_id in ids:
            path, *_, function = test_id.split("::")
            if "::" not in test_id.split("::", 1)[1] and by_value(spec.files[path], function):
                simple += 1
        rows.append((name, len(ids), mutated, simple))
    print(f"{'task':<44}{'graded':>8}{'mutant':>8}{'by value':>10}")
    for name, graded, mutated, simple in rows:
        print(f"{name:<44}{graded:>8}{mutated:>8}{simple:>10}")
    total = [sum(row[index] for row in rows) for index in (1, 2, 3)]
    print(f"{'all':<44}{total[0]:>8}{total[1]:>8}{total[2]:>10}")


if __name__ == "__main__":
    main()
