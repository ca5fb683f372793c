"""The auto rule (test_shape.choose_mode) over generated task shapes: total over any files, deterministic whatever
the files' order, and by value exactly when every construct of the tests is one by value serves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.rollout.grading.test_shape import choose_mode
from opencode_env.wire.grading import GradedTests

HEADER = (
    "import sys\nimport os\nimport pytest\nimport calc\n"
    "from calc import add, Error, LIMIT, Calc\nfrom helper import check\n"
)
HELPER = "def check(function):\n    assert function(1, 2) == 3\n"

SERVED = [
    "assert add(2, 3) == 5",
    "assert calc.add(1, 2) == 3",
    "with pytest.raises(Error):\n        add('a', None)",
    "with pytest.raises(calc.Error, match='x'):\n        calc.add(1, None)",
    "assert LIMIT == 10",
    "assert add(*[1, 2]) == 3",
    "assert add(a=[1, {'k': (2, 3)}], b=-1.5) is not None",
    "assert sorted(add([3], [1])) == [1, 3]",
    "assert add(add(1, 2), 3) == 6",
    "assert add(f'{1}', 'x'.upper())",
    "assert hasattr(calc, 'add')",
    "check(add)",
    "sys.path.insert(0, '/app')",
    "assert add(len('ab'), 1) == 3",
    "assert add(calc.LIMIT, 1) == 11",
    "assert add([n * 2 for n in range(3)], {1: 2}) == 0",
    "value = add(1, 2)\n    assert value.bit_length() == 2",
    "assert os.environ.get('X') is None",
    "try:\n        add(1, None)\n    except Error:\n        pass",
    "assert all(map(add, [1, 2], [3, 4]))",
]
UNSERVED = [
    "assert Calc().total == 0",
    "assert add(lambda x: x, 1)",
    "calc.add = None",
    "del calc.add",
    "assert isinstance(add(1, 2), Calc)",
    "assert open('out.txt').read() == '3'",
    "import subprocess",
    "from unittest import mock",
    "assert calc.add.__name__ == 'add'",
    "assert add(object(), 1)",
    "assert add(range(3), 1)",
    "assert add(n for n in [1])",
    "with calc.session():\n        pass",
    "assert os.listdir('.')",
    "import importlib",
    "assert add(add, 1)",
    "assert sys.modules['calc']",
    "print(add(1, 2), file=sys.stderr)",
    "assert add(check, 1)",
    "assert calc.run(calc)",
    "from pathlib import Path",
    "exec('add(1, 2)')",
    "with pytest.raises(SystemExit):\n        calc.main([])",
    "with pytest.raises(StopIteration):\n        calc.add(1, 2)",
]
FIXTURE_TESTS = ["tmp_path", "monkeypatch", "capsys", "mocker", "request"]


def source_of(constructs: list[str], fixtures: list[str]) -> str:
    tests = []
    for index, construct in enumerate(constructs):
        parameters = ", ".join(fixtures if index == 0 else [])
        tests.append(f"def test_{index}({parameters}):\n    {construct}\n")
    return HEADER + "\n\n".join(tests or [f"def test_nothing({', '.join(fixtures)}):\n    assert add(1, 1) == 2\n"])


def graded(files: dict[str, str], mode: str = "auto") -> GradedTests:
    return GradedTests.model_validate({"files": files, "fail_to_pass": ["test_a.py::test_0"], "mode": mode})


construct = st.sampled_from(SERVED) | st.sampled_from(UNSERVED)


@settings(max_examples=300, deadline=None)
@given(
    files=st.lists(st.lists(construct, max_size=5), min_size=1, max_size=3),
    fixtures=st.lists(st.sampled_from(FIXTURE_TESTS), max_size=2, unique=True),
)
def test_auto_is_by_value_exactly_when_every_construct_is_served(files: list[list[str]], fixtures: list[str]) -> None:
    sources = {f"test_{chr(97 + index)}.py": source_of(body, fixtures) for index, body in enumerate(files)}
    choice = choose_mode(graded({**sources, "helper.py": HELPER}))
    served = not fixtures and all(item in SERVED for body in files for item in body)
    assert choice.mode == ("by_value" if served else "in_process"), choice.reason
    assert not choice.declared
    if not served:
        assert "by value serves tests that call the code with plain values" in choice.reason
        assert ".py:" in choice.reason, "the reason names the file and line"


@pytest.mark.parametrize("unserved", UNSERVED)
def test_each_unserved_construct_alone_keeps_the_task_in_process(unserved: str) -> None:
    choice = choose_mode(graded({"test_a.py": source_of([SERVED[0], unserved], []), "helper.py": HELPER}))
    assert choice.mode == "in_process", unserved


@settings(max_examples=400, deadline=None)
@given(
    files=st.dictionaries(
        st.from_regex(r"[a-z_]{1,8}(/[a-z_]{1,8})?\.py", fullmatch=True),
        st.text(max_size=300) | st.lists(construct, max_size=4).map(lambda body: source_of(body, [])),
        min_size=1,
        max_size=4,
    ),
    mode=st.sampled_from(["auto", "in_process", "by_value"]),
)
def test_the_rule_is_total_and_deterministic(files: dict[str, str], mode: str) -> None:
    tests = graded(files, mode)
    choice = choose_mode(tests)
    assert choice.mode in ("in_process", "by_value")
    assert choose_mode(graded(dict(reversed(list(files.items()))), mode)) == choice, "the files' order changes nothing"
    assert choose_mode(tests) == choice
    if mode != "auto":
        assert (choice.mode, choice.declared) == (mode, True), "a declared mode is kept whatever the tests say"


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"test_a.py": "import json\n\ndef test_0():\n    assert json.loads('1') == 1\n"}, "import no module"),
        ({"test_a.py": "def test_0(:\n"}, "does not parse"),
        ({"test_a.py": "from calc import *\n\ndef test_0():\n    assert add(1, 2) == 3\n"}, "star-imports"),
        ({"test_a.py": "x = (" * 300 + ")" * 300 + "\n"}, "test_a.py"),
        ({"test_a.py": "\x00"}, "does not parse"),
        ({"test_a.py": "from calc import add\n" + "#" * 1_000_000}, "more than auto reads"),
    ],
)
def test_shapes_auto_leaves_in_process_say_why(files: dict[str, str], why: str) -> None:
    choice = choose_mode(graded(files))
    assert choice.mode == "in_process", choice.reason
    assert why in choice.reason, choice.reason
