"""The test grader: the request's tests run by the product, graded by test id from a JUnit report the host reads,
with canary tests beside them as tripwires for a forged report.

The tests, the files the task hands over with them and a few canaries go into a tests' directory inside the verifier
directory (outside the work dir, made empty by every hand-over, written by the host). pytest runs from the work dir
through `pytest_runner.py` in the image's Python, isolated: no configuration, plugin, bytecode or module of the
agent's is read (see that file), with `-c` an empty config file of the grader's and `--rootdir`/`--confcutdir` the
tests' directory (no ini, pyproject or conftest.py above it is read), the cache provider off, collection errors not
stopping the run, and the JUnit report written into the verifier directory, which the host reads without following a
link. The reward is which expected ids passed: a run that exits early, collects only (`--co`) or deselects writes no
report or no passing test case, so it scores 0.

Code under test runs in pytest's own process, so it can rewrite the report or patch pytest. The canaries make that
visible: tests with random names, some that must pass and some that must fail, each file beside a graded test file and
mirroring it (its docstring, its imports, the solution's among them, whether its tests sit in a class, the form of its
name), run in the same session. The host holds pytest's exit status and its terminal summary line against the
report: a must-fail canary reported passed, a must-pass canary missing from a report (its file not failing to
import), status 0 although canaries failed, a summary whose counts the report contradicts, or a report that is not
plain XML (a DTD: pytest never writes one) is a forged report (reward 0, a finding). What it cannot see: code that
tells the canaries apart by what their tests do (they never call the solution, and fail on constants) and forges the
report, the summary and the status consistently.
"""

from __future__ import annotations

import ast
import logging
import posixpath
import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

from opencode_env.sandbox.base import VERIFIER_DIR
from opencode_env.wire.grading import GradedOutcome, GradedTest, GradedTests, IntegrityFinding

log = logging.getLogger("opencode_env.rollout.graded_tests")

TESTS_DIR = f"{VERIFIER_DIR}/tests"
"""Outside the work dir; the verifier directory is emptied by every hand-over and only the grader writes there."""
JUNIT = f"{VERIFIER_DIR}/.opencode-env-junit.xml"
RUNNER = f"{VERIFIER_DIR}/.opencode-env-pytest-runner.py"
EMPTY_INI = f"{VERIFIER_DIR}/.opencode-env-pytest.ini"
"""Named by `-c`, so pytest looks for no other configuration."""
RUNNER_SOURCE = (Path(__file__).with_name("pytest_runner.py")).read_text(encoding="utf-8")
MAX_JUNIT_BYTES = 64 * 2**20
CANARY_FILES = 2
CANARIES_PER_FILE = 2
WORDS = (
    "add", "basic", "boundary", "case", "check", "count", "default", "edge", "empty", "format", "input", "large",
    "limit", "list", "long", "many", "match", "merge", "mixed", "negative", "nested", "none", "order", "output",
    "parse", "range", "repeat", "result", "short", "simple", "single", "small", "sort", "split", "string", "types",
    "unicode", "value", "values", "zero",
)  # fmt: skip
"""Canary names are made of these, as a test's name often is."""


@dataclass(frozen=True)
class Canaries:
    """Tests the grader adds to the session: `must_pass` and `must_fail` are node ids relative to the tests' dir."""

    files: dict[str, str] = field(default_factory=dict)
    must_pass: tuple[str, ...] = ()
    must_fail: tuple[str, ...] = ()


def make_canaries(spec: GradedTests) -> Canaries:
    """Fresh canaries for one rollout: CANARY_FILES files, each beside a graded test file and mirroring it (its
    docstring and imports, its tests in a class or not, `test_*.py` or `*_test.py`), so that nothing of a file's
    source, name or place tells a canary from a graded test; named to clash with no module of the tests (pytest
    imports same-named test files of different directories as one module)."""
    taken = {posixpath.basename(path).removesuffix(".py") for path in spec.files}
    graded = sorted(set(_expected(spec)))
    files: dict[str, str] = {}
    must_pass: list[str] = []
    must_fail: list[str] = []
    kinds = [True, False] * (CANARY_FILES * CANARIES_PER_FILE // 2)
    _shuffle(kinds)
    for index in range(CANARY_FILES):
        graded_path, *parts = secrets.choice(graded).split("::")
        directory, graded_name = posixpath.split(graded_path)
        module = _fresh_module(taken, suffixed=not graded_name.startswith("test_"))
        taken.add(module)
        path = posixpath.join(directory, f"{module}.py")
        owner = f"Test{_fresh_name(set()).removeprefix('test_').title().replace('_', '')}" if len(parts) > 1 else ""
        functions: list[str] = []
        names: set[str] = set()
        for passes in kinds[index * CANARIES_PER_FILE : (index + 1) * CANARIES_PER_FILE]:
            name = _fresh_name(names)
            names.add(name)
            functions.append(_canary_source(name, passes, method=bool(owner)))
            (must_pass if passes else must_fail).append("::".join(filter(None, (path, owner, name))))
        body = "\n\n".join(functions) if not owner else f"class {owner}:\n" + "\n".join(functions)
        files[path] = "\n\n\n".join(filter(None, (_header(spec.files.get(graded_path, "")), body)))
    return Canaries(files=files, must_pass=tuple(must_pass), must_fail=tuple(must_fail))


def _header(source: str) -> str:
    """A test file without its tests: its docstring, imports (the solution's modules among them), constants,
    helpers, fixtures and comments as written, what a canary beside it starts with. Empty when it does not parse
    (its tests then fail to collect anyway)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    lines = source.splitlines()
    for node in reversed([node for node in tree.body if _is_test(node)]):
        first = min([node.lineno, *(item.lineno for item in _decorators(node))])
        del lines[first - 1 : node.end_lineno]
    return re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines)).strip("\n")


def _is_test(node: ast.stmt) -> bool:
    """What pytest collects by default: `test*` functions and `Test*` classes."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name.startswith("test")
    return isinstance(node, ast.ClassDef) and node.name.startswith("Test")


def _decorators(node: ast.stmt) -> list[ast.expr]:
    return node.decorator_list if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else []


def _fresh_module(taken: set[str], *, suffixed: bool) -> str:
    while True:
        name = _fresh_name(taken)
        if suffixed:
            name = f"{name.removeprefix('test_')}_test"
        if name not in taken:
            return name


def _fresh_name(taken: set[str]) -> str:
    while True:
        name = f"test_{secrets.choice(WORDS)}_{secrets.choice(WORDS)}"
        if name not in taken:
            return name


def _shuffle(items: list[bool]) -> None:
    for index in range(len(items) - 1, 0, -1):
        other = secrets.randbelow(index + 1)
        items[index], items[other] = items[other], items[index]


def _canary_source(name: str, passes: bool, *, method: bool) -> str:
    """A test that passes or fails on constants alone, whatever the solution does."""
    values = [secrets.randbelow(1000) for _ in range(2 + secrets.randbelow(4))]
    off = 0 if passes else 1 + secrets.randbelow(9)
    shape = secrets.randbelow(3)
    if shape == 0:
        check = f"assert sum(values) == {sum(values) + off}"
    elif shape == 1:
        check = f"assert max(values) - min(values) == {max(values) - min(values) + off}"
    else:
        check = f"assert len(str(values)) == {len(str(values)) + off}"
    source = f"def {name}({'self' if method else ''}):\n    values = {values!r}\n    {check}\n"
    return "".join(f"    {line}" if method else line for line in source.splitlines(keepends=True))


def handed_files(spec: GradedTests, canaries: Canaries) -> dict[str, str]:
    """The protected files the hand-over writes (absolute paths outside the work dir): the tests and canaries under
    TESTS_DIR, the runner, and the grader's empty pytest config."""
    tests = {f"{TESTS_DIR}/{path}": text for path, text in {**spec.files, **canaries.files}.items()}
    return tests | {RUNNER: RUNNER_SOURCE, EMPTY_INI: "[pytest]\n"}


def clear_command() -> str:
    return f"rm -rf -- {shlex.quote(TESTS_DIR)} {shlex.quote(JUNIT)}"


def pytest_command(spec: GradedTests, canaries: Canaries, workdir: str) -> str:
    """pytest over the files the expected ids and the canaries name, from the work dir, configured by nothing in it."""
    files = sorted({test_id.split("::", 1)[0] for test_id in _expected(spec)} | set(canaries.files))
    argv = [
        "python3",
        "-I",
        RUNNER,
        "--tests",
        TESTS_DIR,
        "--workdir",
        workdir,
        "--",
        "-q",
        "-c",
        EMPTY_INI,
        f"--rootdir={TESTS_DIR}",
        f"--confcutdir={TESTS_DIR}",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        f"--junitxml={JUNIT}",
        "-o",
        "junit_family=xunit2",
        *(f"{TESTS_DIR}/{path}" for path in files),
    ]
    return f"cd {shlex.quote(workdir)} && {shlex.join(argv)}"


def junit_key(test_id: str) -> tuple[str, str]:
    """A pytest node id as JUnit names it: `a/test_b.py::C::t[1]` -> ("a.test_b.C", "t[1]")."""
    path, *parts = test_id.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return ".".join([module, *parts[:-1]]), parts[-1] if parts else ""


@dataclass(frozen=True)
class Report:
    """What the JUnit report says: each test case's outcome, and how many cases carry a failure element."""

    outcomes: dict[tuple[str, str], GradedOutcome]
    failures: int
    clean_passes: int


class DtdRefused(Exception):
    """pytest never writes a DTD; one in the report is how a small file expands to gigabytes in the host."""


@dataclass
class _Tally:
    """The report's test cases as expat streams them: each case's direct child tags, its outcome once it closes."""

    outcomes: dict[tuple[str, str], GradedOutcome] = field(default_factory=dict)
    failures: int = 0
    clean_passes: int = 0
    cases: list[tuple[tuple[str, str], set[str]] | None] = field(default_factory=list)

    def start(self, tag: str, attributes: dict[str, str]) -> None:
        parent = self.cases[-1] if self.cases else None
        if parent is not None:
            parent[1].add(tag)
        key = (attributes.get("classname", ""), attributes.get("name", ""))
        self.cases.append((key, set()) if tag == "testcase" else None)

    def end(self, tag: str) -> None:
        case = self.cases.pop()
        if case is None:
            return
        key, tags = case
        self.failures += "failure" in tags
        self.clean_passes += not tags & {"failure", "error", "skipped"}
        outcome: GradedOutcome = "passed"
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        if key in self.outcomes and self.outcomes[key] != outcome:
            outcome = "error"
        self.outcomes[key] = outcome


def _refuse_dtd(*_: object) -> None:
    raise DtdRefused("the report declares a DTD")


def parse_junit(raw: bytes) -> Report | None:
    """The report, or None when it does not parse or declares a DTD (refused before any entity is read). Streamed:
    no tree and no text is kept, only each test case's outcome."""
    tally = _Tally()
    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = _refuse_dtd
    parser.EntityDeclHandler = _refuse_dtd
    parser.StartElementHandler = tally.start
    parser.EndElementHandler = tally.end
    try:
        parser.Parse(raw, True)
    except (expat.ExpatError, DtdRefused) as error:
        log.warning("the JUnit report is refused: %s", error)
        return None
    return Report(tally.outcomes, tally.failures, tally.clean_passes)


SUMMARY = re.compile(r"^=*\s*((?:\d+ (?:subtests )?[a-z]+(?:, )?)+) in [0-9.]+s\b.*$")
COUNT = re.compile(r"(\d+) ((?:subtests )?[a-z]+)")


def terminal_summary(stdout: str) -> dict[str, int] | None:
    """pytest's own last summary line (`1 failed, 3 passed in 0.05s`) as counts by word, or None when there is none."""
    for line in reversed(stdout.splitlines()):
        found = SUMMARY.match(line.strip())
        if found:
            return {word: int(number) for number, word in COUNT.findall(found.group(1))}
    return None


def tripwires(canaries: Canaries, report: Report | None, exit_code: int | None, stdout: str) -> list[str]:
    """Why the report cannot be pytest's honest one (pure); empty when nothing disagrees. A run that wrote no report
    and did not exit 0 is not flagged (a crash or a timeout scores 0 anyway). The summary is held one way only: fewer
    failures or more passes in the report than pytest printed (subtests can give an honest report more cases)."""
    reasons: list[str] = []
    if exit_code == 0 and canaries.must_fail:
        reasons.append("pytest exited 0 although tests it ran must fail")
    if report is None:
        return reasons
    for test_id in canaries.must_fail:
        if report.outcomes.get(junit_key(test_id)) == "passed":
            reasons.append(f"{test_id} must fail and is reported passed")
    for test_id in canaries.must_pass:
        if junit_key(test_id) not in report.outcomes and not _uncollected(report, test_id):
            reasons.append(f"{test_id} must pass and is missing from the report")
    summary = terminal_summary(stdout)
    if summary is not None:
        failed = summary.get("failed", 0)
        passed = summary.get("passed", 0) + summary.get("xpassed", 0) + summary.get("subtests passed", 0)
        if report.failures < failed:
            reasons.append(f"pytest printed {failed} failed, the report has {report.failures} failures")
        if report.clean_passes > passed:
            reasons.append(f"pytest printed {passed} passed, the report has {report.clean_passes} passes")
    return reasons


def _uncollected(report: Report, test_id: str) -> bool:
    """Its file failed to import or was skipped whole (pytest reports the module alone): the canaries import what
    the graded file beside them imports, the solution among them."""
    module = test_id.split("::", 1)[0].removesuffix(".py").replace("/", ".")
    return report.outcomes.get(("", module)) in ("error", "skipped")


@dataclass(frozen=True)
class TestsGrade:
    reward: float
    outcomes: list[GradedTest]
    forged: list[str] = field(default_factory=list)
    """Why the report is not pytest's honest one (the reward is then 0)."""


def grade(
    spec: GradedTests,
    raw: bytes | None,
    *,
    canaries: Canaries | None = None,
    exit_code: int | None = None,
    stdout: str = "",
) -> TestsGrade:
    """The reward from which expected ids passed (pure). No report: every id is missing, reward 0. A report the
    canaries or pytest's own status and summary contradict, or one that is not plain XML: reward 0, and why."""
    report = parse_junit(raw) if raw else None
    unreadable = ["the JUnit report is not the plain XML pytest writes"] if raw and report is None else []
    found = report.outcomes if report else {}
    outcomes = [
        GradedTest(test_id=test_id, expected=expected, outcome=found.get(junit_key(test_id), "missing"))
        for expected, ids in (("fail_to_pass", spec.fail_to_pass), ("pass_to_pass", spec.pass_to_pass))
        for test_id in _unique(ids)
    ]
    forged = [*unreadable, *(tripwires(canaries, report, exit_code, stdout) if canaries is not None else [])]
    passed = sum(1 for outcome in outcomes if outcome.outcome == "passed")
    if forged:
        return TestsGrade(0.0, outcomes, forged)
    if spec.scoring == "fraction":
        return TestsGrade(passed / len(outcomes), outcomes)
    return TestsGrade(1.0 if passed == len(outcomes) else 0.0, outcomes)


def _expected(spec: GradedTests) -> list[str]:
    return [*spec.fail_to_pass, *spec.pass_to_pass]


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def forged_findings(reasons: list[str]) -> list[IntegrityFinding]:
    """A finding per disagreement the tripwires saw."""
    return [
        IntegrityFinding(path=reason[:300], kind="report_forged", act="forged", response="graded_zero")
        for reason in reasons
    ]
