"""The test grader: the request's tests run by pytest in the sandbox (inside/pytest_runner.py), graded by test id
from a JUnit report the host reads without following a link. Code under test runs in pytest's own process and can
forge the report, so the grader's copy of the tests (mutants.py) carries tripwires: fresh names, a mutant beside
each graded test and canaries, held against pytest's exit status and summary. What it catches and what it cannot
see are in docs/grading.md."""

from __future__ import annotations

import logging
import posixpath
import random
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from xml.parsers import expat

from opencode_env.inside import PINNED_FINDER, source
from opencode_env.rollout.grading import mutants
from opencode_env.sandbox.base import VERIFIER_DIR
from opencode_env.wire.grading import GradedOutcome, GradedTest, GradedTests, IntegrityFinding

log = logging.getLogger("opencode_env.rollout.grading.graded_tests")

TESTS_DIR = f"{VERIFIER_DIR}/tests"
"""Outside the work dir; the verifier directory is emptied by every hand-over and only the grader writes there."""
JUNIT = f"{VERIFIER_DIR}/.opencode-env-junit.xml"
RUNNER = f"{VERIFIER_DIR}/.opencode-env-pytest-runner.py"
EMPTY_INI = f"{VERIFIER_DIR}/.opencode-env-pytest.ini"
"""Named by `-c`, so pytest looks for no other configuration."""
RUNNER_SOURCE = source("pytest_runner.py")
FINDER = f"{VERIFIER_DIR}/{PINNED_FINDER}"
"""Beside the runner, which loads it by its path."""
MAX_JUNIT_BYTES = 64 * 2**20
CANARIES = 4
MUTANT_PASSED = " passed and so did its mutant "
"""Constant canaries per rollout, half of them must pass: placed among the graded tests, for tests no mutant covers."""


@dataclass(frozen=True)
class Canaries:
    """The grader's copy of the tests and its tripwires (node ids relative to the tests' dir): `files` the rewritten
    test files (they replace the task's), `ids` each expected id's name in the copy, `twins` (expected id, its
    mutant's id in the copy), and the constant canaries `must_pass` and `must_fail`."""

    files: dict[str, str] = field(default_factory=dict)
    must_pass: tuple[str, ...] = ()
    must_fail: tuple[str, ...] = ()
    ids: dict[str, str] = field(default_factory=dict)
    twins: tuple[tuple[str, str], ...] = ()

    def copy_id(self, test_id: str) -> str:
        return self.ids.get(test_id, test_id)


def make_canaries(spec: GradedTests, rng: random.Random | None = None) -> Canaries:
    """The grader's copy for one rollout (grading/mutants.py): every test of a graded file renamed to a
    fresh random name, each graded test beside its mutant in random order, CANARIES constant canaries among them.
    Nothing is added as a file of its own unless no graded file can be rewritten."""
    rng = rng or random.SystemRandom()
    scopes: dict[str, set[mutants.Scope]] = {}
    for test_id in _expected(spec):
        path, owner, name, _ = _split(test_id)
        scopes.setdefault(path, set()).add((owner, name))
    for test_id in spec.unmutated:
        path, owner, name, _ = _split(test_id)
        scopes.get(path, set()).discard((owner, name))
    paths = sorted({_split(test_id)[0] for test_id in _expected(spec)} & set(spec.files))
    kinds = [True, False] * (CANARIES // 2)
    rng.shuffle(kinds)
    hosts = [path for path in paths if mutants.can_rewrite(spec.files[path])]
    assigned: dict[str, list[bool]] = {}
    for passes in kinds:
        assigned.setdefault(rng.choice(hosts) if hosts else "", []).append(passes)
    files: dict[str, str] = {}
    placed: list[tuple[str, bool]] = []
    copies: dict[str, mutants.Rewritten] = {}
    leftover = assigned.pop("", [])
    for path in paths:
        copy = mutants.rewrite(spec.files[path], scopes.get(path, set()), rng, assigned.get(path, []))
        if copy is None:
            leftover += assigned.get(path, [])
            continue
        files[path], copies[path] = copy.source, copy
        placed += [(_node_id(path, owner, name, ""), passes) for owner, name, passes in copy.canaries]
    if leftover:
        directory = posixpath.dirname(paths[0]) if paths else ""
        path, source, names = _canary_file(directory, leftover, rng, taken={*spec.files, *files})
        files[path] = source
        placed += [(_node_id(path, "", name, ""), passes) for name, passes in zip(names, leftover, strict=True)]
    ids: dict[str, str] = {}
    twins: list[tuple[str, str]] = []
    for test_id in _unique(_expected(spec)):
        path, owner, name, params = _split(test_id)
        copy = copies.get(path)
        if copy is None or (owner, name) not in copy.names:
            continue
        ids[test_id] = _node_id(path, owner, copy.names[owner, name], params)
        if (owner, name) in copy.twins:
            twins.append((test_id, _node_id(path, owner, copy.twins[owner, name], params)))
    return Canaries(
        files=files,
        must_pass=tuple(test_id for test_id, passes in placed if passes),
        must_fail=tuple(test_id for test_id, passes in placed if not passes),
        ids=ids,
        twins=tuple(twins),
    )


def _split(test_id: str) -> tuple[str, str, str, str]:
    """(path, class or "", function, parameters) of a node id: `a/t.py::C::f[1]` -> ("a/t.py", "C", "f", "[1]")."""
    head, bracket, rest = test_id.partition("[")
    path, *parts = head.split("::")
    owner = parts[0] if len(parts) == 2 else "" if len(parts) == 1 else "::".join(parts[:-1])
    return path, owner, parts[-1] if parts else "", bracket + rest


def _node_id(path: str, owner: str, name: str, params: str) -> str:
    return "::".join(filter(None, (path, owner, name))) + params


def _canary_file(
    directory: str, kinds: list[bool], rng: random.Random, *, taken: set[str]
) -> tuple[str, str, list[str]]:
    """A test file of constant canaries alone, for a task whose graded files cannot be rewritten."""
    names_taken: set[str] = set()
    while True:
        path = posixpath.join(directory, f"{mutants.fresh_name(rng, set())}.py")
        if path not in taken:
            break
    names = [mutants.fresh_name(rng, names_taken) for _ in kinds]
    source = b"\n\n".join(
        mutants.canary(name, passes, rng, indent=b"", method=False) for name, passes in zip(names, kinds, strict=True)
    )
    return path, source.decode(), names


def handed_files(spec: GradedTests, canaries: Canaries) -> dict[str, str]:
    """The protected files the hand-over writes (absolute paths outside the work dir): the tests and canaries under
    TESTS_DIR, the runner and its finder, and the grader's empty pytest config."""
    tests = {f"{TESTS_DIR}/{path}": text for path, text in {**spec.files, **canaries.files}.items()}
    return tests | {RUNNER: RUNNER_SOURCE, FINDER: source(PINNED_FINDER), EMPTY_INI: "[pytest]\n"}


def clear_command(*more: str) -> str:
    return shlex.join(["rm", "-rf", "--", TESTS_DIR, JUNIT, *more])


def pytest_command(
    spec: GradedTests, canaries: Canaries, workdir: str, runner_options: Iterable[str] = (), *, cwd: str = ""
) -> str:
    """pytest over the files the expected ids and the canaries name, from the work dir (or `cwd`), configured by
    nothing in it."""
    files = sorted({test_id.split("::", 1)[0] for test_id in _expected(spec)} | set(canaries.files))
    argv = [
        "python3",
        "-I",
        RUNNER,
        "--tests",
        TESTS_DIR,
        "--workdir",
        workdir,
        *runner_options,
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
    return f"cd {shlex.quote(cwd or workdir)} && {shlex.join(argv)}"


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
    no tree and no text is kept, only each test case's outcome. Read as UTF-8 whatever encoding it declares (pytest
    writes UTF-8; expat raises LookupError for a declared encoding it does not know)."""
    tally = _Tally()
    parser = expat.ParserCreate("utf-8")
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


SUMMARY = re.compile(r"^=*\s*((?:[0-9]+ (?:subtests )?[a-z]+(?:, )?)+) in [0-9.]+s\b.*$", re.ASCII)
COUNT = re.compile(r"([0-9]+) ((?:subtests )?[a-z]+)", re.ASCII)
MAX_COUNT_DIGITS = 18
"""A count longer than this is read as 10**18 (int() of a str past 4,300 digits raises; no run has that many)."""


def terminal_summary(stdout: str) -> dict[str, int] | None:
    """pytest's own last summary line (`1 failed, 3 passed in 0.05s`) as counts by word, or None when there is none.
    ASCII digits only, any length (a huge count reads as 10**18)."""
    for line in reversed(stdout.splitlines()):
        found = SUMMARY.match(line.strip())
        if found:
            return {word: _count(number) for number, word in COUNT.findall(found.group(1))}
    return None


def _count(digits: str) -> int:
    return int(digits) if len(digits) <= MAX_COUNT_DIGITS else 10**MAX_COUNT_DIGITS


def tripwires(canaries: Canaries, report: Report | None, exit_code: int | None, stdout: str) -> list[str]:
    """Why the report cannot be pytest's honest one (pure); empty when nothing disagrees. A run that wrote no report
    and did not exit 0 is not flagged (a crash or a timeout scores 0 anyway). The summary is held one way only: fewer
    failures or more passes in the report than pytest printed (subtests can give an honest report more cases)."""
    reasons: list[str] = []
    if exit_code == 0 and (canaries.must_fail or canaries.twins):
        reasons.append("pytest exited 0 although tests it ran must fail")
    if report is None:
        return reasons
    for test_id, mutant in canaries.twins:
        original = report.outcomes.get(junit_key(canaries.copy_id(test_id)))
        twin = report.outcomes.get(junit_key(mutant))
        if original == twin == "passed":
            reasons.append(f"{test_id}{MUTANT_PASSED}{mutant} (the same test, another expected value)")
        elif original is not None and twin is None:
            reasons.append(f"{test_id} is reported and its mutant {mutant} is missing from the report")
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
    copy = canaries or Canaries()
    outcomes = [
        GradedTest(test_id=test_id, expected=expected, outcome=found.get(junit_key(copy.copy_id(test_id)), "missing"))
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
