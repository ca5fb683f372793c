"""What is not a RolloutResult is refused with a clear error, and `export` and `view` take an eval's output dir:
its attempts (never eval.json, summary.json or an attempt cut short), each row naming its source file and attempt,
every column one type in every file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from opencode_env.cli import main
from opencode_env.wire import SCHEMA_VERSION, RolloutResult
from tests.integration.test_formats import clean, forked


def eval_dir(root: Path) -> Path:
    """An eval's output dir as `eval` leaves it: two tasks, one attempt of which an ending cut short."""
    out = root / "eval"
    (out / "results" / "clean").mkdir(parents=True)
    (out / "results" / "forked").mkdir(parents=True)
    (out / "eval.json").write_text(json.dumps({"k": 2, "model": "m", "threshold": 1.0}))
    (out / "summary.json").write_text(json.dumps({"k": 2, "tasks": [], "overall": {}}))
    (out / "results" / "clean" / "1.json").write_text(clean().model_dump_json())
    failed = clean().model_copy(update={"status": "agent_timeout", "reward": None})
    (out / "results" / "clean" / "2.json").write_text(failed.model_dump_json())
    (out / "results" / "forked" / "1.json").write_text(forked().model_dump_json())
    cut = clean().model_copy(update={"status": "cancelled"})
    (out / "results" / "forked" / "2.cancelled.json").write_text(cut.model_dump_json())
    return out


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"k": 2, "model": "m"}', "not a RolloutResult: task_id, status, reward missing"),
        ('{"task_id": "t", "status": "completed", "reward": 1.0, "schema_version": 99}', "schema_version 99 is not"),
        ('{"task_id": "t", "status": "completed", "reward": 1.0, "schema_version": "3"}', "schema_version '3' is not"),
        ('{"task_id": "t", "status": "finished", "reward": 1.0}', "status"),
    ],
)
def test_what_is_not_a_result_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        RolloutResult.model_validate_json(text)


def test_every_schema_version_it_knows_still_parses() -> None:
    for version in range(1, SCHEMA_VERSION + 1):
        data = {"task_id": "t", "status": "completed", "reward": 1.0, "schema_version": version}
        assert RolloutResult.model_validate_json(json.dumps(data)).reward == 1.0
    assert RolloutResult.model_validate_json(RolloutResult().model_dump_json()).status == "completed"
    fixture = Path(__file__).parents[1] / "fixtures" / "result_v0_demo.json"
    assert RolloutResult.model_validate_json(fixture.read_bytes()).status == "completed"


def test_export_and_view_refuse_an_eval_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = eval_dir(tmp_path)
    assert main(["export", str(out / "eval.json"), str(out / "summary.json")]) == 2
    assert f"{out / 'eval.json'} is not a RolloutResult: (top level): not a RolloutResult" in capsys.readouterr().err
    assert main(["view", str(out / "summary.json")]) == 2
    assert f"{out / 'summary.json'} is not a RolloutResult" in capsys.readouterr().err


def test_export_of_an_eval_dir_names_source_and_attempt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = eval_dir(tmp_path)
    assert main(["export", "--format", "sequences", str(out), "-o", str(tmp_path / "rows.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    origins = [(Path(row["source"]).relative_to(out).as_posix(), row["attempt"]) for row in rows]
    assert origins == [("results/clean/1.json", 1), ("results/clean/2.json", 2), *[("results/forked/1.json", 1)] * 2]
    assert "4 rows (4 usable, 0 not) from 3 rollouts (1 not completed" in capsys.readouterr().err


def test_export_columns_have_one_type_in_every_file(tmp_path: Path) -> None:
    """A file of failed rollouts only (no reward, a problem) and a file of clean ones: no column is null in one and
    set in the other, so the files concatenate."""
    failed = clean().model_copy(update={"status": "agent_timeout", "reward": None})
    (tmp_path / "failed.json").write_text(failed.model_dump_json())
    (tmp_path / "clean.json").write_text(clean().model_dump_json())
    types: dict[str, set[str]] = {}
    for name in ("failed", "clean"):
        for file_format in ("trl", "sequences", "steps"):
            rows_file = tmp_path / f"{name}-{file_format}.jsonl"
            assert main(["export", "--format", file_format, str(tmp_path / f"{name}.json"), "-o", str(rows_file)]) == 0
            for line in rows_file.read_text().splitlines():
                for column, value in json.loads(line).items():
                    types.setdefault(f"{file_format}.{column}", set()).add(type(value).__name__)
    mixed = {
        column: kinds for column, kinds in types.items() if len(kinds - {"int"} if "float" in kinds else kinds) > 1
    }
    assert mixed == {}
    assert not any("NoneType" in kinds for kinds in types.values())


def test_view_of_an_eval_dir_writes_a_page_per_attempt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = eval_dir(tmp_path)
    assert main(["view", str(out)]) == 0
    pages = capsys.readouterr().out.split()
    assert [Path(page).relative_to(out).as_posix() for page in pages] == [
        "results/clean/1.html",
        "results/clean/2.html",
        "results/forked/1.html",
    ]
    assert all(Path(page).read_text().startswith("<!DOCTYPE html>") for page in pages)
