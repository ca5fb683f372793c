"""The test grader's pure parts (canaries, the tripwires, the summary line) and its runner, run by the venv's own
Python and pytest (the integration tests run it in the base image's): the runner reads no configuration, plugin,
bytecode or module of a hostile work dir, and a forged report trips the canaries."""

from __future__ import annotations

import pytest

from opencode_env.rollout.grading import graded_tests
from opencode_env.rollout.grading.graded_tests import (
    Canaries,
    Report,
    junit_key,
    make_canaries,
    terminal_summary,
    tripwires,
)
from opencode_env.wire.grading import MAX_FINDING_PATH, MAX_FINDINGS, GradedTests, IntegrityFinding, capped, tampering

SPEC = GradedTests.model_validate(
    {
        "files": {"test_calc.py": "", "sub/test_more.py": "", "helper.py": ""},
        "fail_to_pass": ["test_calc.py::test_add", "sub/test_more.py::TestA::test_b[1]"],
    }
)


def test_tripwires_live_in_the_graded_files_under_fresh_names() -> None:
    spec = SPEC.model_copy(
        update={
            "files": {"test_calc.py": "def test_add():\n    pass\n", "sub/test_more.py": "class TestA:\n    pass\n"}
        }
    )
    seen = set()
    for _ in range(50):
        canaries = make_canaries(spec)
        assert len(canaries.must_pass) == len(canaries.must_fail) == 2
        assert set(canaries.files) == {"test_calc.py"}
        ids = {*canaries.must_pass, *canaries.must_fail}
        assert len(ids) == 4
        assert all(test_id.split("::")[0] in canaries.files for test_id in ids)
        seen.add(tuple(sorted(ids)))
    assert len(seen) == 50


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


MIRRORED = GradedTests.model_validate(
    {
        "files": {
            "test_calc.py": '"""Adding."""\n\nfrom __future__ import annotations\n\nimport pytest\nfrom add import (\n'
            "    add,\n)\n\nLIMIT = 3\n\n\ndef test_add():\n    assert add(1, 2) == LIMIT\n",
            "sub/calc_test.py": "from add import add\n\n\nclass TestAdd:\n    def test_b(self):\n"
            "        assert add(1, 1) == 2\n",
        },
        "fail_to_pass": ["test_calc.py::test_add", "sub/calc_test.py::TestAdd::test_b"],
    }
)


def test_the_copy_keeps_each_file_but_its_tests_names_and_adds_mutants_beside_them() -> None:
    header = MIRRORED.files["test_calc.py"].split("\n\n\ndef test_add")[0]
    for _ in range(30):
        canaries = make_canaries(MIRRORED)
        assert canaries.files["test_calc.py"].startswith(header + "\n\n\ndef test_")
        assert canaries.files["sub/calc_test.py"].startswith("from add import add\n\n\nclass TestAdd:\n    def test_")
        assert canaries.copy_id("test_calc.py::test_add").startswith("test_calc.py::test_")
        assert canaries.copy_id("sub/calc_test.py::TestAdd::test_b").startswith("sub/calc_test.py::TestAdd::test_")
        assert [test_id for test_id, _ in canaries.twins] == ["sub/calc_test.py::TestAdd::test_b"]
        for path, source in canaries.files.items():
            compile(source, path, "exec")
            assert "def test_add(" not in source
            assert "def test_b(" not in source
        assert canaries.files["sub/calc_test.py"].count("assert add(1, 1) == ") == 2


def test_a_canary_file_that_fails_to_import_excuses_its_missing_must_pass_canaries() -> None:
    report = Report({**HONEST.outcomes, ("", "test_a_b"): "error"}, 1, 1)
    del report.outcomes[junit_key("test_a_b.py::test_x")]
    assert tripwires(CANARIES, report, 1, "1 failed, 1 passed, 1 error in 0.1s") == []
    assert tripwires(CANARIES, Report({**report.outcomes, ("", "test_a_b"): "passed"}, 1, 2), 1, "") != []


def test_a_report_that_is_not_plain_xml_is_forged() -> None:
    spec = GradedTests.model_validate({"files": {"test_calc.py": ""}, "fail_to_pass": ["test_calc.py::test_add"]})
    case = '<testsuites><testsuite><testcase classname="test_calc" name="test_add"/></testsuite></testsuites>'
    assert graded_tests.grade(spec, case.encode()).reward == 1.0
    for raw in (
        f'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "x">]>{case}',
        case[:-5],
        "\ufeff" + case.replace("/>", ">&a;</testcase>"),
    ):
        graded = graded_tests.grade(spec, raw.encode("utf-16"))
        assert (graded.reward, graded.forged) == (0.0, ["the JUnit report is not the plain XML pytest writes"]), raw
    assert graded_tests.grade(spec, case.encode("utf-16")).reward == 1.0


def test_findings_are_bounded_and_keep_every_kind() -> None:
    many = [
        IntegrityFinding(path="d/" * 3000 + str(index), kind="link", act="created", response="not_carried")
        for index in range(5000)
    ]
    many.append(IntegrityFinding(path="conftest.py", kind="conftest", act="created", response="removed"))
    kept = capped(many)
    assert len(kept) == MAX_FINDINGS + 2
    assert all(len(item.path) <= MAX_FINDING_PATH for item in kept)
    assert kept[0].path.startswith("d/d/")
    assert kept[0].path.endswith("more characters)")
    assert {item.path for item in kept[MAX_FINDINGS:]} == {"(4800 more not listed)", "(1 more not listed)"}
    assert tampering(kept) == tampering(many) == ["conftest", "link"]
    assert capped(many[-1:]) == many[-1:]
