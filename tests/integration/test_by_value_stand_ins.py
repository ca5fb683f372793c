"""The by-value stand-ins, end to end on the host: pytest through the grader's runner, the code under test in a
server process of its own, the two talking only through the socket (the sandboxed route is
test_by_value_grader.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from opencode_env.inside import PINNED_FINDER, source
from opencode_env.rollout.grading import by_value
from opencode_env.rollout.grading.graded_tests import RUNNER_SOURCE, parse_junit

SOLUTION = {
    "calc/__init__.py": """\
from calc.errors import Bad

PI = 3.14
__all__ = ["add", "PI"]


def add(a, b):
    if a == "bad":
        raise Bad("bad input")
    if a == "key":
        raise KeyError("k")
    return a + b


class Box:
    @staticmethod
    def pair(a):
        return (a, [a], {a: {a}}, b"\\x00", -0.0)


def sneaky():
    class Anything:
        def __eq__(self, other):
            return True

    return Anything()


def endless():
    while True:
        pass


def exits():
    import os

    os._exit(0)
""",
    "calc/errors.py": "class Bad(ValueError):\n    pass\n",
}
TESTS = """\
import pytest
from calc import *
import calc
import calc.errors


def test_a_call():
    assert add(2, 3) == 5 and PI == 3.14


def test_b_plain_values_come_back_alike():
    assert calc.Box.pair(1) == (1, [1], {1: {1}}, b"\\x00", -0.0)
    assert type(calc.Box.pair(1)[2]) is dict


def test_c_a_builtin_exception_with_its_args():
    with pytest.raises(KeyError) as raised:
        add("key", 1)
    assert raised.value.args == ("k",)


def test_d_its_own_exception_class_and_its_builtin_base():
    with pytest.raises(calc.errors.Bad, match="bad input"):
        add("bad", 1)
    with pytest.raises(ValueError):
        add("bad", 1)


def test_e_an_object_equal_to_everything():
    assert calc.sneaky() == 5


def test_f_an_argument_that_cannot_cross():
    with pytest.raises(Exception):
        add(object(), 1)


def test_g_an_endless_loop():
    calc.endless()


def test_h_after_a_timeout_every_call_fails():
    assert add(1, 1) == 2
"""
EXPECTED = {
    "test_a_call": "passed",
    "test_b_plain_values_come_back_alike": "passed",
    "test_c_a_builtin_exception_with_its_args": "passed",
    "test_d_its_own_exception_class_and_its_builtin_base": "passed",
    "test_e_an_object_equal_to_everything": "failed",
    "test_f_an_argument_that_cannot_cross": "failed",
    "test_g_an_endless_loop": "failed",
    "test_h_after_a_timeout_every_call_fails": "failed",
}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_stand_ins_reach_the_code_under_test_by_value_only(tmp_path: Path) -> None:
    work, tests, grader = tmp_path / "work", tmp_path / "tests", tmp_path / "grader"
    write(work, SOLUTION)
    write(tests, {"test_calc.py": TESTS})
    write(
        grader, {path.removeprefix(f"{by_value.VERIFIER_DIR}/"): text for path, text in by_value.handed_files().items()}
    )
    root = str(grader / by_value.ROOT.rsplit("/", 1)[1])
    write(grader, {"runner.py": RUNNER_SOURCE, PINNED_FINDER: source(PINNED_FINDER)})
    sock, report = str(tmp_path / "s.sock"), tmp_path / "junit.xml"
    served = subprocess.Popen(
        by_value.server_argv(str(work), 60, socket=sock, root=root, python=sys.executable, uid=-1),
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runner = [sys.executable, "-I", str(grader / "runner.py"), "--tests", str(tests), "--workdir", str(work)]
    pytest_args = ["-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(tests / "test_calc.py")]
    options = by_value.runner_options(2, socket=sock, root=root)
    argv = [*runner, *options, "--", *pytest_args]
    ran = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300, cwd=work)
    served.kill()
    served.wait()
    parsed = parse_junit(report.read_bytes())
    assert parsed is not None, ran.stdout
    outcomes = {name: outcome for (_, name), outcome in parsed.outcomes.items()}
    assert outcomes == EXPECTED, ran.stdout
    assert "ByValueBroken" in ran.stdout
    assert "no answer within 2s" in ran.stdout
    assert "builtins.object cannot cross by value" in ran.stdout
