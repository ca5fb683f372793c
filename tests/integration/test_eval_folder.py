"""`eval DIR` takes a folder as the docs say: its task directories and its request JSON / JSONL files, each counted
and named; broken ones are listed with why in the table, summary.json and index.html; at -k 1 the table shows pass@1
once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencode_env.evals.inputs import load_each, read_folder
from opencode_env.evals.summary import EvalSummary, Tally, format_table
from tests.integration.test_eval_broken import run_cli
from tests.integration.test_eval_runner import SOLVED
from tests.integration.test_harbor_task import make_task


def _folder(root: Path) -> Path:
    folder = root / "dataset"
    folder.mkdir()
    (folder / "solved.json").write_text(json.dumps(SOLVED.model_dump(exclude_defaults=True)))
    second = SOLVED.model_copy(update={"task_id": "solved-again"})
    (folder / "more.jsonl").write_text(json.dumps(second.model_dump(exclude_defaults=True)) + "\n")
    (folder / "not-json.json").write_text("{not json")
    (folder / "notes.txt").write_text("not an input")
    (folder / ".hidden.json").write_text("{}")
    make_task(folder, "no-instruction", instruction=None)
    (folder / "linked.json").symlink_to(folder / "solved.json")
    return folder


def test_a_folder_gives_its_task_dirs_and_request_files_each_named(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    found = read_folder(folder)
    assert found.task_dirs == [folder / "no-instruction"]
    assert found.request_files == [folder / "more.jsonl", folder / "not-json.json", folder / "solved.json"]
    refused = f"{folder / 'linked.json'}: a symbolic link; what a folder holds is never read through links"
    assert found.refused == [refused]
    said: list[str] = []
    loaded = load_each([folder], oracle=True, report=said.append)
    assert said[0] == f"{folder}: 1 task directories, 3 request files, 1 refused"
    assert sorted(task.task_id for task in loaded.tasks) == ["solved", "solved-again"]
    assert [line.split(":")[0] for line in loaded.broken] == [
        str(folder / "linked.json"),
        str(folder / "not-json.json"),
        str(folder / "no-instruction"),
    ]


def test_eval_of_a_folder_lists_the_broken_inputs_in_the_table_summary_and_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, out = _folder(tmp_path), tmp_path / "eval"
    assert run_cli(folder, "--out", out, "--oracle", "-k", "1") == 1
    printed = capsys.readouterr().out
    assert "broken inputs, not run (3):" in printed
    assert f"  {folder / 'not-json.json'}: not JSON" in printed
    summary = EvalSummary.model_validate_json((out / "summary.json").read_text())
    assert len(summary.broken) == 3
    assert sorted(task.task_id for task in summary.tasks) == ["solved", "solved-again"]
    index = (out / "index.html").read_text()
    assert "Broken inputs, not run (3)" in index
    assert "no-instruction" in index
    assert "instruction.md: missing" in index


def test_the_table_at_k_1_shows_pass_at_1_once() -> None:
    counts = {"attempts": 1, "scored": 1, "successes": 1, "pass_at_1": 1.0, "pass_at_k": 1.0, "mean_reward": 1.0}
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "llm_calls": 0, "rollout_s": 1.0}
    tally = Tally.model_validate({**counts, **usage, "statuses": {"completed": 1}, "infrastructure_failures": {}})
    summary = EvalSummary(k=1, threshold=1.0, tasks=[], overall=tally, reduced_k=[])
    header = format_table(summary).splitlines()[0].split()
    assert header.count("pass@1") == 1
    assert format_table(summary.model_copy(update={"k": 4})).splitlines()[0].split().count("pass@4") == 1
