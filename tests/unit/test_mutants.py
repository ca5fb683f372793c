"""The grader's copy of the tests (grading/mutants.py, graded_tests.make_canaries), pure: over generated test files the
copy runs like the task's tests and an honest run trips nothing; a forger that knows the scheme (random names, mutants
beside their originals in random order, constant canaries among them) and flips failures by any tell of form escapes
the tripwires with probability 2^-k, k the failing graded tests a mutant covers, measured over many copies."""

from __future__ import annotations

import ast
import math
import random
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.rollout.check_task import mutants_to_drop, without_mutants
from opencode_env.rollout.grading import mutants
from opencode_env.rollout.grading.graded_tests import (
    MUTANT_PASSED,
    Canaries,
    Report,
    junit_key,
    make_canaries,
    tripwires,
)
from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.grading import GradedTests

literals = st.recursive(
    st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.none(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
        | st.frozensets(st.integers() | st.text(max_size=5), max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(value=literals, seed=st.integers(0, 2**32))
def test_a_perturbed_value_differs_keeps_its_type_and_reads_back(value: object, seed: int) -> None:
    changed = mutants.perturb(value, random.Random(seed))
    if changed is None:
        return
    assert type(changed) is type(value)
    assert changed != value
    assert ast.literal_eval(repr(changed)) == changed


quarters = st.integers(-4000, 4000).map(lambda number: number / 4)
small = st.booleans() | st.integers() | quarters | st.text("a0Z", min_size=1, max_size=1)


@settings(max_examples=100, deadline=None)
@given(value=small | st.lists(small, min_size=1, max_size=2), seed=st.integers(0, 2**32))
def test_the_draw_is_symmetric(value: object, seed: int) -> None:
    """Whatever `a` can become can become `a` again (floats exactly where the sums are exact): the pair does not say
    which one was drawn from the other."""
    changed = mutants.perturb(value, random.Random(seed))
    assert changed is not None
    back = {repr(mutants.perturb(changed, random.Random(other))) for other in range(600)}
    assert repr(value) in back


def test_what_has_no_perturbation() -> None:
    rng = random.Random(0)
    nothing = (None, [], {}, (), "", b"", float("nan"), float("inf"), [None], {"a": None})
    assert [mutants.perturb(value, rng) for value in nothing] == [None] * len(nothing)


def expected(kind: int, a: int, b: int) -> tuple[str, str]:
    """A call to add and its right expected value, as source."""
    if kind == 0:
        return f"add({a}, {b})", repr(a + b)
    if kind == 1:
        return f"add({str(a)!r}, {str(b)!r})", repr(str(a) + str(b))
    if kind == 2:
        return f"add([{a}], [{b}])", repr([a, b])
    return f"add(({a},), ({b}, {a}))", repr((a, b, a))


@st.composite
def add_test_files(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A test file of add's tests (right expected values): functions and methods with one to three assertions, the
    literal on either side, some with no literal at all; and the node ids of those graded."""
    lines = ['"""Tests of add."""', "from add import add", "", "LIMIT = 3", ""]
    ids: list[str] = []
    number = 0
    for owner in draw(st.lists(st.sampled_from(["", "TestAdd", "TestMore"]), min_size=1, max_size=4, unique=True)):
        indent = "    " if owner else ""
        if owner:
            lines += ["", f"class {owner}:"]
        for _ in range(draw(st.integers(1, 3))):
            number += 1
            name = f"test_{number}"
            lines += ["", "", f"{indent}def {name}({'self' if owner else ''}):", f"{indent}    # checks add"]
            for _ in range(draw(st.integers(1, 3))):
                a, b = draw(st.integers(-50, 50)), draw(st.integers(-50, 50))
                call, value = expected(draw(st.integers(0, 3)), a, b)
                form = draw(st.integers(0, 2))
                check = [f"{call} == {value}", f"{value} == {call}", f"{call} == {call}"][form]
                lines.append(f"{indent}    assert {check}")
            if draw(st.booleans()):
                ids.append("::".join(filter(None, ("test_add.py", owner, name))))
    return "\n".join(lines) + "\n", ids or [f"test_add.py::{'::'.join(filter(None, (owner, name)))}"]


@contextmanager
def solution(add: Callable[[object, object], object]) -> Iterator[None]:
    module = types.ModuleType("add")
    module.add = add  # type: ignore[attr-defined]
    sys.modules["add"] = module
    try:
        yield
    finally:
        del sys.modules["add"]


def right(a: object, b: object) -> object:
    return a + b  # type: ignore[operator]


def wrong(a: object, b: object) -> object:
    return a - b if isinstance(a, int) else b + a  # type: ignore[operator]


def honest_run(files: dict[str, str], add: Callable[[object, object], object]) -> dict[tuple[str, str], str]:
    """Every test of the copy run as pytest would, in this process: outcomes keyed as the JUnit report keys them."""
    outcomes: dict[tuple[str, str], str] = {}
    with solution(add):
        for path, source in files.items():
            namespace: dict[str, object] = {}
            exec(compile(source, path, "exec"), namespace)
            module = path.removesuffix(".py").replace("/", ".")
            for name, value in list(namespace.items()):
                if name.startswith("Test") and isinstance(value, type):
                    for method in [item for item in vars(value) if item.startswith("test")]:
                        outcomes[f"{module}.{name}", method] = run(getattr(value(), method))
                elif name.startswith("test") and callable(value):
                    outcomes[module, name] = run(value)
    return outcomes


def run(test: Callable[[], object]) -> str:
    try:
        test()
    except AssertionError:
        return "failed"
    return "passed"


def report_of(outcomes: dict[tuple[str, str], str]) -> Report:
    return Report(
        outcomes=dict(outcomes),  # type: ignore[arg-type]
        failures=sum(outcome == "failed" for outcome in outcomes.values()),
        clean_passes=sum(outcome == "passed" for outcome in outcomes.values()),
    )


def spec_of(source: str, ids: list[str]) -> GradedTests:
    return GradedTests.model_validate({"files": {"test_add.py": source}, "fail_to_pass": ids})


@settings(max_examples=100, deadline=None)
@given(case=add_test_files(), seed=st.integers(0, 2**32))
def test_the_copy_grades_as_the_tests_do_and_an_honest_run_trips_nothing(
    case: tuple[str, list[str]], seed: int
) -> None:
    source, ids = case
    spec = spec_of(source, ids)
    copy = make_canaries(spec, random.Random(seed))
    for add, reward in ((right, 1.0), (wrong, None)):
        outcomes = honest_run(copy.files, add)
        report = report_of(outcomes)
        assert tripwires(copy, report, 1, "") == [], (source, copy.files)
        truth = honest_run(spec.files, add)
        for test_id in ids:
            assert outcomes[junit_key(copy.copy_id(test_id))] == truth[junit_key(test_id)]
        if reward is not None:
            assert all(outcomes[junit_key(copy.copy_id(test_id))] == "passed" for test_id in ids)
            assert all(outcomes[junit_key(mutant)] == "failed" for _, mutant in copy.twins)
    mutated = {test_id for test_id, _ in copy.twins}
    for test_id in ids:
        original = _function(copy, copy.copy_id(test_id))
        assert original.name != test_id.rsplit("::", 1)[1]
        assert (test_id in mutated) == any(
            isinstance(item, ast.Assert) and _literal_side(item) for item in original.body
        )


def _function(copy: Canaries, copy_id: str) -> ast.FunctionDef:
    path, *_, name = copy_id.split("::")
    return next(
        node
        for node in ast.walk(ast.parse(copy.files[path]))
        if isinstance(node, ast.FunctionDef) and node.name == name
    )


def _literal_side(statement: ast.Assert) -> bool:
    if not isinstance(statement.test, ast.Compare):
        return False
    sides = [statement.test.left, *statement.test.comparators]
    return sum(1 for side in sides if _is_literal(side)) == 1


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


Tell = Callable[[list[ast.FunctionDef]], ast.FunctionDef]
"""How a forger picks, among tests alike but for one literal, the one it takes for the original."""
TELLS: dict[str, Tell] = {
    "the first in the file": lambda group: min(group, key=lambda node: node.lineno),
    "the first name in order": lambda group: min(group, key=lambda node: node.name),
    "the smaller expected value": lambda group: min(group, key=lambda node: ast.dump(node.body[-1])),
    "the shorter source": lambda group: min(group, key=lambda node: (len(ast.unparse(node)), node.lineno)),
}


def forge(copy: Canaries, outcomes: dict[tuple[str, str], str], tell: Tell) -> dict[tuple[str, str], str]:
    """A forger in pytest's process that knows every tell of form: it reads the copy's source, leaves alone the tests
    that never call the solution (the constant canaries), groups tests that differ only in their names and literals,
    and makes a failing test pass when it has no such twin, or when `tell` picks it among its failing twins."""
    forged = dict(outcomes)
    for path, source in copy.files.items():
        module = path.removesuffix(".py").replace("/", ".")
        groups: dict[str, list[tuple[tuple[str, str], ast.FunctionDef]]] = {}
        for owner, node in _test_functions(ast.parse(source)):
            if not any(isinstance(item, ast.Name) and item.id == "add" for item in ast.walk(node)):
                continue
            key = (".".join(filter(None, (module, owner))), node.name)
            groups.setdefault(_shape(node), []).append((key, node))
        for members in groups.values():
            failing = [(key, node) for key, node in members if outcomes[key] == "failed"]
            if len(members) == 1:
                picks = [key for key, _ in failing]
            elif len(failing) == len(members):
                chosen = tell([node for _, node in failing])
                picks = [key for key, node in failing if node is chosen]
            else:
                picks = []
            for key in picks:
                forged[key] = "passed"
    return forged


def _test_functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            yield "", node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    yield node.name, item


def _shape(node: ast.FunctionDef) -> str:
    """The test with its name and every literal side of an assertion's `==` blanked: what it shares with its mutant."""
    blank = ast.parse(ast.unparse(node)).body[0]
    assert isinstance(blank, ast.FunctionDef)
    blank.name = ""
    for item in ast.walk(blank):
        if isinstance(item, ast.Assert) and isinstance(item.test, ast.Compare):
            compare = item.test
            compare.left = ast.Constant(None) if _is_literal(compare.left) else compare.left
            compare.comparators = [ast.Constant(None) if _is_literal(side) else side for side in compare.comparators]
    return ast.dump(blank)


def evaded(spec: GradedTests, copy: Canaries, tell: Tell) -> bool:
    """The forged run scores 1.0 and no tripwire sees it."""
    forged = forge(copy, honest_run(copy.files, wrong), tell)
    failed_somewhere = any(outcome == "failed" for outcome in forged.values())
    reasons = tripwires(copy, report_of(forged), 1 if failed_somewhere else 0, "")
    passed = all(forged[junit_key(copy.copy_id(test_id))] == "passed" for test_id in spec.fail_to_pass)
    return passed and not reasons


def task_with(failing: int, rng: random.Random) -> GradedTests:
    """`failing` graded tests a wrong add fails, each with one assertion a mutant can perturb, their expected values
    drawn at random (a prior flat over the draw's range); and one test it passes."""
    tests = []
    for index in range(failing):
        a, b = rng.randrange(-500, 500), rng.randrange(1, 500)
        tests.append(f"def test_{index}():\n    assert add({a}, {b}) == {a + b}\n")
    tests.append("def test_zero():\n    assert add(0, 0) == 0\n")
    source = "from add import add\n\n\n" + "\n\n".join(tests)
    ids = [f"test_add.py::test_{index}" for index in range(failing)] + ["test_add.py::test_zero"]
    return spec_of(source, ids)


@pytest.mark.parametrize("tell", sorted(TELLS))
@pytest.mark.parametrize("failing", [1, 2, 3])
def test_a_forger_that_knows_every_tell_of_form_escapes_with_probability_two_to_the_minus_k(
    tell: str, failing: int
) -> None:
    """Per failing graded test with a mutant, the forger's pick is a coin flip: over 300 copies, its escapes stay
    within five standard deviations of 300 * 2^-k."""
    rng = random.Random(f"{tell}/{failing}")
    trials = 300
    escapes = 0
    for _ in range(trials):
        spec = task_with(failing, rng)
        escapes += evaded(spec, make_canaries(spec, rng), TELLS[tell])
    chance = 2.0**-failing
    spread = 5 * math.sqrt(trials * chance * (1 - chance))
    print(f"{tell}, k={failing}: escaped {escapes}/{trials}, 2^-k predicts {trials * chance:.0f}")
    assert abs(escapes - trials * chance) <= spread, (escapes, trials * chance)


def test_a_forger_that_flips_every_failure_of_the_solution_always_trips() -> None:
    rng = random.Random(7)
    spec = task_with(1, rng)
    for _ in range(100):
        copy = make_canaries(spec, rng)
        outcomes = honest_run(copy.files, wrong)
        forged = {key: "passed" if key[1] in _calls_add(copy) else value for key, value in outcomes.items()}
        reasons = tripwires(copy, report_of(forged), 1, "")
        assert any("and so did its mutant" in reason for reason in reasons), reasons


def _calls_add(copy: Canaries) -> set[str]:
    return {
        node.name
        for source in copy.files.values()
        for _, node in _test_functions(ast.parse(source))
        if "add(" in ast.unparse(node)
    }


def test_a_parametrized_test_in_a_class_gets_a_parametrized_mutant_in_the_class() -> None:
    source = (
        "import pytest\nfrom add import add\n\n\nclass TestAdd:\n"
        "    @pytest.mark.parametrize('a', [1, 2])\n    def test_a(self, a):\n        assert add(a, 1) == 'x'\n"
    )
    spec = GradedTests.model_validate(
        {"files": {"t/test_x.py": source}, "fail_to_pass": ["t/test_x.py::TestAdd::test_a[1]"]}
    )
    copy = make_canaries(spec, random.Random(3))
    ((test_id, mutant),) = copy.twins
    assert test_id == "t/test_x.py::TestAdd::test_a[1]"
    assert copy.copy_id(test_id).startswith("t/test_x.py::TestAdd::test_")
    assert copy.copy_id(test_id).endswith("[1]")
    assert mutant.startswith("t/test_x.py::TestAdd::test_")
    assert mutant.endswith("[1]")
    text = copy.files["t/test_x.py"]
    assert text.count("@pytest.mark.parametrize('a', [1, 2])") == 2
    assert "def test_a(" not in text
    compile(text, "t/test_x.py", "exec")


def test_a_test_named_elsewhere_keeps_its_name_and_gets_no_mutant() -> None:
    source = "from add import add\n\n\ndef test_a():\n    assert add(1, 1) == 2\n\n\ndef test_b():\n    test_a()\n"
    spec = GradedTests.model_validate(
        {"files": {"test_x.py": source}, "fail_to_pass": ["test_x.py::test_a", "test_x.py::test_b"]}
    )
    copy = make_canaries(spec, random.Random(1))
    assert copy.copy_id("test_x.py::test_a") == "test_x.py::test_a"
    assert copy.copy_id("test_x.py::test_b") != "test_x.py::test_b"
    assert copy.twins == ()


def test_a_file_that_does_not_parse_gets_its_canaries_in_a_file_of_their_own() -> None:
    spec = GradedTests.model_validate(
        {"files": {"sub/test_x.py": "def test_a(:\n"}, "fail_to_pass": ["sub/test_x.py::test_a"]}
    )
    copy = make_canaries(spec, random.Random(1))
    (path,) = copy.files
    assert path.startswith("sub/test_")
    assert len(copy.must_pass) == len(copy.must_fail) == 2
    assert copy.ids == {}


def test_check_task_names_the_mutants_the_oracle_passes_or_fails_beside() -> None:
    tests = {
        "files": {"test_x.py": ""},
        "fail_to_pass": ["test_x.py::test_a", "test_x.py::test_b", "test_x.py::test_c"],
        "unmutated": ["test_x.py::test_c"],
    }
    request = RolloutRequest.model_validate({"instruction": "x", "tests": tests})
    reason = f"test_x.py::test_a{MUTANT_PASSED}test_x.py::test_q (the same test, another expected value)"
    oracle = RolloutResult.model_validate(
        {
            "task_id": "t",
            "sandbox_id": "s",
            "status": "agent_error",
            "integrity": [{"path": reason, "kind": "report_forged", "act": "forged", "response": "graded_zero"}],
            "test_outcomes": [
                {"test_id": "test_x.py::test_a", "expected": "fail_to_pass", "outcome": "passed"},
                {"test_id": "test_x.py::test_b", "expected": "fail_to_pass", "outcome": "failed"},
                {"test_id": "test_x.py::test_c", "expected": "fail_to_pass", "outcome": "failed"},
            ],
        }
    )
    dropped = mutants_to_drop(request, oracle)
    assert dropped == ["test_x.py::test_a", "test_x.py::test_b"]
    again = without_mutants(request, dropped)
    assert again.tests is not None
    assert again.tests.unmutated == ["test_x.py::test_c", "test_x.py::test_a", "test_x.py::test_b"]
    spec = again.tests.model_copy(
        update={"files": {"test_x.py": "".join(f"def test_{n}():\n    assert 1 == 1\n\n\n" for n in "abc")}}
    )
    assert make_canaries(spec, random.Random(0)).twins == ()


def test_canaries_in_a_tab_indented_class_are_indented_as_it_is() -> None:
    source = "from add import add\n\n\nclass TestT:\n\tdef test_a(self):\n\t\tassert add(1, 1) == 2\n"
    spec = GradedTests.model_validate({"files": {"test_t.py": source}, "fail_to_pass": ["test_t.py::TestT::test_a"]})
    for seed in range(20):
        copy = make_canaries(spec, random.Random(seed))
        compile(copy.files["test_t.py"], "test_t.py", "exec")
        assert len(copy.must_pass) == 2
        assert all(test_id.startswith("test_t.py::TestT::test_") for test_id in copy.must_fail)
