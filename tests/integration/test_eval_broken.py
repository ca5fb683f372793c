"""`opencode-env eval` over a folder holding a broken task: the broken one is named with why on stderr, the rest
run (exit 1: not everything ran), and --fail-fast stops at the first broken task (exit 2) before any rollout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from opencode_env.cli.eval import add_eval_parser
from opencode_env.evals import EvalError, load_tasks
from opencode_env.evals.inputs import load_each
from tests.integration.test_eval_runner import SOLVED
from tests.integration.test_harbor_task import make_task


def run_cli(*argv: str | Path) -> int:
    parser = argparse.ArgumentParser(prog="opencode-env")
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["eval", *map(str, argv)])
    code: int = args.handler(args)
    return code


def broken_inputs(tmp_path: Path) -> list[Path]:
    if (tmp_path / "good.json").exists():
        return [tmp_path / name for name in ("good.json", "not-json.json", "mixed.jsonl", "dataset")]
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SOLVED.model_dump(exclude_defaults=True)))
    not_json = tmp_path / "not-json.json"
    not_json.write_text("{not json")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"instruction": "x", "agent_timeout_s": -1}) + "\n")
    dataset = tmp_path / "dataset"
    make_task(dataset, "no-instruction", instruction=None)
    return [good, not_json, mixed, dataset]


def test_loading_names_each_broken_task_and_keeps_the_rest(tmp_path: Path) -> None:
    loaded = load_each(broken_inputs(tmp_path), oracle=True)
    assert [task.task_id for task in loaded.tasks] == ["solved"]
    assert len(loaded.broken) == 3
    assert loaded.broken[0].startswith(f"{tmp_path / 'not-json.json'}: not JSON")
    assert loaded.broken[1].startswith(f"{tmp_path / 'mixed.jsonl'} line 1: not a RolloutRequest: agent_timeout_s")
    assert loaded.broken[2].startswith(str(tmp_path / "dataset" / "no-instruction"))
    with pytest.raises(EvalError, match=r"not-json\.json: not JSON"):
        load_tasks(broken_inputs(tmp_path), oracle=True)


def test_eval_runs_the_rest_of_a_folder_with_a_broken_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs, out = broken_inputs(tmp_path), tmp_path / "eval"
    assert run_cli(*inputs, "--out", out, "--oracle", "-k", "1") == 1
    captured = capsys.readouterr()
    skipped = [line for line in captured.err.splitlines() if "broken task skipped:" in line]
    assert len(skipped) == 3
    assert "opencode-env eval: 1 task(s) to run, 3 broken" in captured.err
    assert "broken:     3 task(s) skipped" in captured.out
    assert json.loads((out / "results" / "solved" / "1.json").read_text())["reward"] == 1.0

    assert run_cli(*inputs, "--out", tmp_path / "fast", "--oracle", "-k", "1", "--fail-fast") == 2
    assert "opencode-env eval: " + str(tmp_path / "not-json.json") + ": not JSON" in capsys.readouterr().err
    assert not (tmp_path / "fast").exists()


def test_a_jsonl_keeps_its_valid_lines_and_names_each_bad_one_by_its_number(tmp_path: Path) -> None:
    """One bad line used to drop the whole file, its valid lines too, and hide its other bad lines."""
    lines = [
        json.dumps({"instruction": "first", "task_id": "a"}),
        "{not json",
        json.dumps({"instruction": "third", "task_id": "c"}),
        json.dumps({"instruction": "fourth", "timeout_secs": 300}),
        "",
        "[1, 2",
        json.dumps({"instruction": "seventh", "task_id": "g"}),
    ]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(lines) + "\n")
    loaded = load_each([mixed])
    assert [task.task_id for task in loaded.tasks] == ["a", "c", "g"]
    assert [line.split(": ")[0] for line in loaded.broken] == [f"{mixed} line {n}" for n in (2, 4, 6)]
    assert "not JSON" in loaded.broken[0]
    assert "timeout_secs (did you mean" in loaded.broken[1]
    assert "not JSON" in loaded.broken[2]
    with pytest.raises(EvalError, match=r"mixed\.jsonl line 2: not JSON"):
        load_tasks([mixed])
