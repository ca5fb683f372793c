"""Every task file parse is bounded: a task.toml or request JSON nested 400,000 deep (a RecursionError in Python's
parsers), or with more items than a task has, is a broken-task error naming the file and the limit, and `eval` and
`check-task` go on with the healthy task beside it; brackets inside strings and comments count for nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_env.evals.inputs import load_each
from opencode_env.rollout.grading.reward import parse_reward_json
from opencode_env.tasks import HarborTask, TaskFormatError
from opencode_env.wire.bounded_parse import REWARD_JSON, TASK_TOML, loads_json, loads_toml
from tests.integration.test_eval_runner import SOLVED
from tests.integration.test_harbor_task import TOML_1_0, make_task

DEEP = 400_000
DEEP_TOML = "a = " + "[" * DEEP + "]" * DEEP + "\n"
DEEP_JSON = "[" * DEEP + "]" * DEEP


def test_a_task_toml_nested_400000_deep_is_a_broken_task_naming_the_file_and_the_limit(tmp_path: Path) -> None:
    task = make_task(tmp_path, "deep", toml=DEEP_TOML)
    with pytest.raises(TaskFormatError) as refused:
        HarborTask.from_dir(task)
    assert str(refused.value) == f"{task / 'task.toml'}: over the nesting depth limit of {TASK_TOML.max_depth}"


def test_a_task_toml_with_more_items_than_a_task_has_is_refused(tmp_path: Path) -> None:
    many = TOML_1_0 + "[metadata]\ntags = [" + "1," * (TASK_TOML.max_items + 1) + "]\n"
    with pytest.raises(TaskFormatError, match=f"over the item count limit of {TASK_TOML.max_items}"):
        HarborTask.from_dir(make_task(tmp_path, "many", toml=many))


def test_brackets_in_toml_strings_and_comments_are_not_nesting() -> None:
    deep_text = "[" * 100 + "{" * 100
    toml = (
        f'a = "{deep_text}"\nb = \'{deep_text}\'\nc = """\n{deep_text}\\"""\n"""\n'
        f"d = '''{deep_text}'''\n# {deep_text}\ne = [[1], [2]] # ]]]]\n"
    )
    parsed = loads_toml(toml, where="t.toml", limits=TASK_TOML)
    assert parsed["a"] == deep_text
    assert parsed["e"] == [[1], [2]]
    assert parsed["c"] == f'{deep_text}"""\n'


def test_eval_names_the_deep_task_and_request_file_and_loads_the_healthy_one(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SOLVED.model_dump(exclude_defaults=True)))
    deep_json = tmp_path / "deep.json"
    deep_json.write_text(DEEP_JSON)
    dataset = tmp_path / "dataset"
    make_task(dataset, "deep", toml=DEEP_TOML)
    loaded = load_each([good, deep_json, dataset], oracle=True)
    assert [task.task_id for task in loaded.tasks] == ["solved"]
    assert loaded.broken == [
        f"{deep_json}: over the nesting depth limit of 64",
        f"{dataset / 'deep'}: {dataset / 'deep' / 'task.toml'}: over the nesting depth limit of {TASK_TOML.max_depth}",
    ]


def test_check_task_refuses_a_deep_task_toml_by_name(tmp_path: Path) -> None:
    task = make_task(tmp_path, "deep", toml=DEEP_TOML)
    argv = [sys.executable, "-m", "opencode_env.cli", "check-task", str(task)]
    checked = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert checked.returncode == 2
    assert f"{task / 'task.toml'}: over the nesting depth limit" in checked.stderr
    assert "RecursionError" not in checked.stderr


def test_a_deep_reward_json_is_a_reward_problem_not_a_crash() -> None:
    parsed = parse_reward_json(('{"reward": 1, "x": ' + DEEP_JSON + "}").encode())
    assert parsed.value is None
    assert f"reward.json: over the nesting depth limit of {REWARD_JSON.max_depth}" in (parsed.problem or "")


def test_brackets_in_json_strings_are_not_nesting() -> None:
    deep_text = "[" * 100 + '\\"' + "{" * 100 + "\\\\"
    text = json.dumps({"a": deep_text, "b": [deep_text, {"c": "]]]]"}]})
    assert loads_json(text, where="r.json", limits=REWARD_JSON) == json.loads(text)
