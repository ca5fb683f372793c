"""The test grader: the request's tests run by the product, graded by test id from a JUnit report the host reads.

The tests go into a directory of the work dir the grader empties first (`.opencode-env-tests`: nothing the agent put
there survives), written by the host. pytest runs from the work dir with no configuration file of anyone's
(`-c` an empty file of the grader's, `--rootdir` and `--confcutdir` the tests' directory: no ini, pyproject or
conftest of the agent's is read), `--import-mode=append` (the tests' directory goes last on sys.path; the work dir,
through the grader's sitecustomize, last too), the cache provider off, and writes its JUnit report into the
verifier directory, which the host reads without following a link. The reward is which expected ids passed: a run
that exits 0 early (`os._exit` during collection), collects only (`--co`) or deselects writes no report or no
passing test case, so it scores 0. What it cannot stop: code under test that patches pytest itself in the same
process (any in-process grader shares that).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from xml.etree import ElementTree

from opencode_env.sandbox.base import VERIFIER_DIR
from opencode_env.wire.grading import GradedOutcome, GradedTest, GradedTests

log = logging.getLogger("opencode_env.rollout.graded_tests")

TESTS_DIR = ".opencode-env-tests"
JUNIT = f"{VERIFIER_DIR}/.opencode-env-junit.xml"
EMPTY_INI = ".opencode-env-pytest.ini"
"""In the tests' directory: named by `-c`, so pytest looks for no other configuration."""
MAX_JUNIT_BYTES = 64 * 2**20


def handed_files(spec: GradedTests) -> dict[str, str]:
    """The protected files the hand-over writes: the tests under TESTS_DIR, and the grader's empty pytest config."""
    return {f"{TESTS_DIR}/{path}": text for path, text in spec.files.items()} | {
        f"{TESTS_DIR}/{EMPTY_INI}": "[pytest]\n"
    }


def clear_command(workdir: str) -> str:
    return f"rm -rf -- {shlex.quote(f'{workdir}/{TESTS_DIR}')} {shlex.quote(JUNIT)}"


def pytest_command(spec: GradedTests, workdir: str) -> str:
    """pytest over the files the expected ids name, from the work dir, configured by nothing in it."""
    tests = f"{workdir}/{TESTS_DIR}"
    files = sorted({test_id.split("::", 1)[0] for test_id in (*spec.fail_to_pass, *spec.pass_to_pass)})
    argv = [
        "python3",
        "-m",
        "pytest",
        "-q",
        "-c",
        f"{tests}/{EMPTY_INI}",
        f"--rootdir={tests}",
        f"--confcutdir={tests}",
        "--import-mode=append",
        "-p",
        "no:cacheprovider",
        f"--junitxml={JUNIT}",
        "-o",
        "junit_family=xunit2",
        *(f"{tests}/{path}" for path in files),
    ]
    return f"cd {shlex.quote(workdir)} && {shlex.join(argv)}"


def junit_key(test_id: str) -> tuple[str, str]:
    """A pytest node id as JUnit names it: `a/test_b.py::C::t[1]` -> ("a.test_b.C", "t[1]")."""
    path, *parts = test_id.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return ".".join([module, *parts[:-1]]), parts[-1] if parts else ""


def parse_junit(raw: bytes) -> dict[tuple[str, str], GradedOutcome]:
    """Each test case's outcome by (classname, name); a report that does not parse gives none."""
    try:
        root = ElementTree.fromstring(raw)
    except ElementTree.ParseError as error:
        log.warning("the JUnit report does not parse: %s", error)
        return {}
    outcomes: dict[tuple[str, str], GradedOutcome] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        outcome: GradedOutcome = "passed"
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        if key in outcomes and outcomes[key] != outcome:
            outcome = "error"
        outcomes[key] = outcome
    return outcomes


@dataclass(frozen=True)
class TestsGrade:
    reward: float
    outcomes: list[GradedTest]


def grade(spec: GradedTests, report: bytes | None) -> TestsGrade:
    """The reward from which expected ids passed (pure). No report: every id is missing, reward 0."""
    found = parse_junit(report) if report else {}
    outcomes = [
        GradedTest(test_id=test_id, expected=expected, outcome=found.get(junit_key(test_id), "missing"))
        for expected, ids in (("fail_to_pass", spec.fail_to_pass), ("pass_to_pass", spec.pass_to_pass))
        for test_id in _unique(ids)
    ]
    passed = sum(1 for outcome in outcomes if outcome.outcome == "passed")
    if spec.scoring == "fraction":
        return TestsGrade(passed / len(outcomes), outcomes)
    return TestsGrade(1.0 if passed == len(outcomes) else 0.0, outcomes)


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))
