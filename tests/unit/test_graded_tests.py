"""The test grader's pure parts (canaries, the tripwires, the summary line) and its runner, run by the venv's own
Python and pytest (the integration tests run it in the base image's): the runner reads no configuration, plugin,
bytecode or module of a hostile work dir, and a forged report trips the canaries."""

from __future__ import annotations

import importlib.util
import marshal
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_env.rollout import graded_tests
from opencode_env.rollout.graded_tests import Canaries, Report, junit_key, make_canaries, terminal_summary, tripwires
from opencode_env.wire.grading import GradedTests

SPEC = GradedTests.model_validate(
    {
        "files": {"test_calc.py": "", "sub/test_more.py": "", "helper.py": ""},
        "fail_to_pass": ["test_calc.py::test_add", "sub/test_more.py::TestA::test_b[1]"],
    }
)


def test_canaries_are_fresh_named_like_tests_and_placed_beside_the_graded_ones() -> None:
    seen = set()
    for _ in range(50):
        canaries = make_canaries(SPEC)
        assert len(canaries.must_pass) == len(canaries.must_fail) == 2
        assert len(canaries.files) == 2
        for path in canaries.files:
            name = posixpath.basename(path)
            assert name.startswith("test_")
            assert name.endswith(".py")
            assert name.removesuffix(".py") not in {"test_calc", "test_more", "helper"}
            assert posixpath.dirname(path) in {"", "sub"}
        ids = {*canaries.must_pass, *canaries.must_fail}
        assert len(ids) == 4
        assert all(test_id.split("::")[0] in canaries.files for test_id in ids)
        seen.add(tuple(sorted(canaries.files)))
    assert len(seen) > 40


def test_the_summary_line_is_pytests_last_one() -> None:
    out = "noise\n1 passed in 9.0s\nFAILED a.py::t\n2 failed, 5 passed, 1 skipped, 3 errors in 0.52s\n"
    assert terminal_summary(out) == {"failed": 2, "passed": 5, "skipped": 1, "errors": 3}
    assert terminal_summary("=== 4 passed, 1 xpassed, 2 warnings in 1.00s (0:00:01) ===") == {
        "passed": 4,
        "xpassed": 1,
        "warnings": 2,
    }
    assert terminal_summary("no tests ran\n") is None
    assert terminal_summary("1 failed, 2 passed, 3 subtests passed, 1 subtests failed in 0.1s") == {
        "failed": 1,
        "passed": 2,
        "subtests passed": 3,
        "subtests failed": 1,
    }


CANARIES = Canaries(files={}, must_pass=("test_a_b.py::test_x",), must_fail=("test_c_d.py::test_y",))
HONEST = Report(
    outcomes={
        junit_key("test_a_b.py::test_x"): "passed",
        junit_key("test_c_d.py::test_y"): "failed",
        junit_key("test_calc.py::test_add"): "passed",
    },
    failures=1,
    clean_passes=2,
)


@pytest.mark.parametrize(
    ("report", "exit_code", "stdout", "reason"),
    [
        (HONEST, 1, "1 failed, 2 passed in 0.1s", None),
        (None, 3, "", None),
        (None, None, "", None),
        (HONEST, 0, "1 failed, 2 passed in 0.1s", "exited 0"),
        (None, 0, "", "exited 0"),
        (Report({**HONEST.outcomes, junit_key("test_c_d.py::test_y"): "passed"}, 0, 3), 1, "", "reported passed"),
        (Report({junit_key("test_calc.py::test_add"): "passed"}, 0, 1), 1, "", "missing from the report"),
        (HONEST, 1, "2 failed, 1 passed in 0.1s", "printed 2 failed"),
        (HONEST, 1, "0 failed, 2 passed, 1 subtests failed in 0.1s", None),
        (HONEST, 1, "1 failed, 1 passed, 1 error in 0.1s", "printed 1 passed"),
    ],
)
def test_the_tripwires(report: Report | None, exit_code: int | None, stdout: str, reason: str | None) -> None:
    reasons = tripwires(CANARIES, report, exit_code, stdout)
    assert (reason is None) == (reasons == []), reasons
    if reason is not None:
        assert any(reason in found for found in reasons), reasons


def test_a_forged_grade_is_zero_and_names_why() -> None:
    spec = GradedTests.model_validate({"files": {"test_calc.py": ""}, "fail_to_pass": ["test_calc.py::test_add"]})
    junit = b'<testsuites><testsuite><testcase classname="test_calc" name="test_add"/></testsuite></testsuites>'
    graded = graded_tests.grade(spec, junit, canaries=CANARIES, exit_code=0, stdout="1 passed in 0.1s")
    assert graded.reward == 0.0
    assert [test.outcome for test in graded.outcomes] == ["passed"]
    assert graded.forged
    findings = graded_tests.forged_findings(graded.forged)
    assert {(item.kind, item.act, item.response) for item in findings} == {("report_forged", "forged", "graded_zero")}
    assert graded_tests.grade(spec, junit).reward == 1.0


TEST_CALC = "from add import add\nfrom helper import check\n\n\ndef test_add():\n    check(add)\n"
HELPER = "def check(add):\n    assert add(2, 3) == 5\n"
FORCE_PASS = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
PASS_ALL_AT_IMPORT = (
    "import _pytest.reports\n_made = _pytest.reports.TestReport.from_item_and_call.__func__\n"
    "def _passed(cls, item, call):\n    report = _made(cls, item, call)\n"
    "    report.outcome, report.longrepr = 'passed', None\n    return report\n"
    "_pytest.reports.TestReport.from_item_and_call = classmethod(_passed)\n"
)


def hostile_workdir(workdir: Path, add: str) -> None:
    """A wrong or right add.py beside a plugin by an upper-case DIST-INFO, modules shadowing the graded test and the
    handed helper, a pytest package, a sitecustomize and an unchecked-hash pyc of the helper."""
    files = {
        "add.py": add,
        "Evil.DIST-INFO/entry_points.txt": "[pytest11]\nzz = zz_plugin\n",
        "Evil.DIST-INFO/METADATA": "Metadata-Version: 2.1\nName: zz\nVersion: 1\n",
        "zz_plugin.py": FORCE_PASS,
        "test_calc.py": "def test_add():\n    pass\n",
        "helper.py": "def check(add):\n    pass\n",
        "pytest/__init__.py": "import os\nos._exit(0)\n",
        "sitecustomize.py": "import os\nos._exit(0)\n",
        "conftest.py": FORCE_PASS,
        "pytest.ini": "[pytest]\naddopts = --co\n",
    }
    for path, text in files.items():
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_text(text)
    pyc = workdir / "__pycache__" / f"helper.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir()
    code = compile("def check(add):\n    pass\n", "helper.py", "exec")
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + bytes(8) + marshal.dumps(code))


def run_graded(tmp_path: Path, add: str) -> graded_tests.TestsGrade:
    """The grader's own command, its paths moved under tmp_path, run by this venv's Python."""
    spec = GradedTests.model_validate(
        {"files": {"test_calc.py": TEST_CALC, "helper.py": HELPER}, "fail_to_pass": ["test_calc.py::test_add"]}
    )
    workdir, verifier = tmp_path / "workdir", tmp_path / "verifier"
    workdir.mkdir()
    hostile_workdir(workdir, add)
    canaries = make_canaries(spec)
    for path, text in graded_tests.handed_files(spec, canaries).items():
        target = verifier / posixpath.relpath(path, posixpath.dirname(graded_tests.TESTS_DIR))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    command = graded_tests.pytest_command(spec, canaries, str(workdir))
    command = command.replace(posixpath.dirname(graded_tests.TESTS_DIR), str(verifier)).replace(
        "python3 -I", f"{sys.executable} -I"
    )
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, check=False)
    junit = verifier / posixpath.basename(graded_tests.JUNIT)
    raw = junit.read_bytes() if junit.exists() else None
    return graded_tests.grade(spec, raw, canaries=canaries, exit_code=ran.returncode, stdout=ran.stdout)


def test_the_runner_reads_nothing_of_a_hostile_work_dir(tmp_path: Path) -> None:
    (tmp_path / "wrong").mkdir()
    (tmp_path / "right").mkdir()
    wrong = run_graded(tmp_path / "wrong", "def add(a, b):\n    return a - b\n")
    assert (wrong.reward, wrong.forged, [test.outcome for test in wrong.outcomes]) == (0.0, [], ["failed"])
    right = run_graded(tmp_path / "right", "def add(a, b):\n    return a + b\n")
    assert (right.reward, right.forged) == (1.0, [])
    assert not list((tmp_path / "right" / "verifier").rglob("__pycache__"))


def test_the_runner_sees_a_forged_outcome(tmp_path: Path) -> None:
    forged = run_graded(tmp_path, f"{PASS_ALL_AT_IMPORT}\ndef add(a, b):\n    return a - b\n")
    assert forged.reward == 0.0
    assert any("reported passed" in reason for reason in forged.forged), forged.forged
