"""The test grader's runner (inside/pytest_runner.py) run for real, on this virtualenv's pytest, against a hostile work
dir: it starts Python, so it lives here rather than in the unit tier."""

from __future__ import annotations

import importlib.util
import marshal
import os
import posixpath
import subprocess
import sys
from pathlib import Path

from opencode_env.rollout.grading import graded_tests
from opencode_env.rollout.grading.graded_tests import make_canaries
from opencode_env.wire.grading import GradedTests

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
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    ran = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert not list(scratch.iterdir()), "the runner left its scratch behind"
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
