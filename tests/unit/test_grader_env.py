"""Verify's environment and the grader-file diff, without a sandbox: the real Python and git of this machine run
under the variables verify gets, and the diff is a pure function."""

from __future__ import annotations

import pytest

from opencode_env.rollout.check_task import task_warnings
from opencode_env.rollout.grading.graded_tests import grade, junit_key
from opencode_env.rollout.grading.grader_env import verify_environment
from opencode_env.rollout.grading.integrity import Entry, Listing, repair
from opencode_env.wire import RolloutRequest, RolloutResult, result_summary
from opencode_env.wire.grading import GradedTest, GradedTests, IntegrityFinding, tampering


def test_the_task_env_is_kept_and_the_grader_wins() -> None:
    env = verify_environment({"TASK_VAR": "x", "GIT_PAGER": "less"}, "/home/user/workdir")
    assert env["TASK_VAR"] == "x"
    assert env["GIT_PAGER"] == "cat"
    assert env["GIT_CEILING_DIRECTORIES"] == "/home/user"
    keys = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))}
    assert keys["core.fsmonitor"] == "false"
    assert keys["core.hooksPath"] == "/dev/null"


def listing(entries: dict[str, tuple[str, bytes | None]]) -> Listing:
    made = Listing()
    for path, (kind, content) in entries.items():
        made.entries[path] = Entry(kind, len(content or b""), "1")
        if content is not None:
            made.contents[path] = content
    return made


def test_the_diff_removes_what_the_agent_made_and_restores_what_it_changed() -> None:
    before = listing(
        {"pytest.ini": ("f", b"[pytest]\n"), "conftest.py": ("f", b"x = 1\n"), "lib/x.cpython-311.pyc": ("f", None)}
    )
    after = listing(
        {
            "pytest.ini": ("f", b"[pytest]\naddopts = --co\n"),
            "pytest": ("d", None),
            "pytest/__init__.py": ("f", b""),
            "tests/conftest.py": ("f", b"import os\n"),
            "pyproject.toml": ("f", b"[project]\n"),
            "tests/__pycache__": ("d", None),
            "tests/__pycache__/helper.cpython-311.pyc": ("f", None),
            "lib/x.cpython-311.pyc": ("f", None),
        }
    )
    plan = repair(before, after, ["pyproject.toml"])
    assert plan.restore == {"pytest.ini": "[pytest]\n", "conftest.py": "x = 1\n"}
    assert sorted(plan.remove) == ["lib/x.cpython-311.pyc", "pytest", "tests/__pycache__", "tests/conftest.py"]
    acts = {(f.path, f.kind, f.act, f.response) for f in plan.findings}
    assert acts == {
        ("conftest.py", "conftest", "deleted", "restored"),
        ("pytest.ini", "test_config", "changed", "restored"),
        ("pytest", "shadow_module", "created", "removed"),
        ("pyproject.toml", "test_config", "created", "kept"),
        ("tests/__pycache__", "bytecode", "created", "removed"),
        ("tests/conftest.py", "conftest", "created", "removed"),
    }
    assert tampering(plan.findings) == ["conftest", "shadow_module", "test_config"]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"verify": ["python -m pytest -q"]}, "hands over no protected tests"),
        ({"verify": ["pytest tests"], "files": {"tests/test_a.py": "x"}, "verify_files": {"b": "y"}}, "can change"),
        ({"verify": ["true"], "solution_files": ["conftest.py"]}, "solution_files names conftest.py"),
    ],
)
def test_check_task_warns_of_what_lets_an_agent_move_its_grade(fields: dict[str, object], expected: str) -> None:
    request = RolloutRequest.model_validate({"instruction": "x", **fields})
    assert any(expected in warning for warning in task_warnings(request)), task_warnings(request)


def test_a_task_handing_its_tests_over_gets_no_warning() -> None:
    request = RolloutRequest.model_validate(
        {"instruction": "x", "verify": ["python -m pytest -q tests"], "verify_files": {"tests/test_a.py": "x"}}
    )
    assert task_warnings(request) == []


def test_old_results_without_findings_still_parse() -> None:
    finding = IntegrityFinding(path="conftest.py", kind="conftest", act="created", response="removed")
    assert IntegrityFinding.model_validate_json(finding.model_dump_json()) == finding


def test_junit_names_and_the_reward_by_id() -> None:
    assert junit_key("a/test_b.py::C::t[1]") == ("a.test_b.C", "t[1]")
    spec = GradedTests(files={"t.py": ""}, fail_to_pass=["t.py::a", "t.py::b"], pass_to_pass=["t.py::c"])
    report = (
        b'<testsuites><testsuite><testcase classname="t" name="a"/>'
        b'<testcase classname="t" name="b"><failure message="x"/></testcase></testsuite></testsuites>'
    )
    graded = grade(spec, report)
    assert [test.outcome for test in graded.outcomes] == ["passed", "failed", "missing"]
    assert graded.reward == 0.0
    assert grade(spec.model_copy(update={"scoring": "fraction"}), report).reward == pytest.approx(1 / 3)
    assert grade(spec, None).reward == 0.0
    assert grade(spec, b"<not xml").reward == 0.0


def test_the_summary_names_the_findings_and_the_tests() -> None:
    result = RolloutResult(
        integrity=[IntegrityFinding(path="conftest.py", kind="conftest", act="created", response="removed")],
        test_outcomes=[GradedTest(test_id="t.py::a", expected="fail_to_pass", outcome="failed")],
    )
    summary = result_summary(result)
    assert "integrity:  1 (conftest.py created->removed)" in summary
    assert "tests:      0/1 expected ids passed" in summary
    assert RolloutResult.model_validate_json(result.model_dump_json()) == result
    assert RolloutResult.model_validate_json('{"task_id": "t", "status": "completed", "reward": 1.0}').integrity == []
