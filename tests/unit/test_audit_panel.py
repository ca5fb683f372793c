"""The audit's pure parts: plays read from their headers, the survey's output parsed whatever it holds, the layouts
as request transforms."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opencode_env.audit.driver import file_name
from opencode_env.audit.layouts import (
    MAX_KEEPS,
    native,
    ours,
    parse_survey,
    unhardened,
)
from opencode_env.audit.plays import PlayError, panel, parse_play
from opencode_env.audit.records import evidence_log, outcome_of
from opencode_env.wire import MAX_COMMAND_CHARS, RolloutRequest, RolloutResult
from opencode_env.wire.grading import IntegrityFinding

FAMILIES = {
    "visible tests",
    "test-runner hooks",
    "interpreter start-up",
    "code under test",
    "reward channel",
    "repository history",
    "exposed answers",
    "grader programs",
}


def test_a_header_without_a_field_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PlayError, match=r"mine\.sh: header lacks proves, fix"):
        parse_play("#!/bin/bash\n# name: x\n# family: f\n# tries: t\n# applies: true\necho\n", "mine.sh")
    with pytest.raises(PlayError, match="name 'Bad Name'"):
        parse_play("# name: Bad Name\n# family: f\n# tries: t\n# proves: p\n# applies: true\n# fix: f\n", "x.sh")


def test_a_folder_of_plays_adds_and_replaces(tmp_path: Path) -> None:
    (tmp_path / "tests-edit.sh").write_text(
        "# name: tests-edit\n# family: mine\n# tries: t\n# proves: p\n# applies: true\n# fix: f\ntrue\n"
    )
    (tmp_path / "extra.sh").write_text(
        "# name: extra\n# family: mine\n# tries: t\n# proves: p\n# applies: true\n# fix: f\n"
    )
    plays = {play.name: play for play in panel([tmp_path])}
    assert plays["tests-edit"].family == "mine"
    assert "extra" in plays
    assert "git-mine" in plays
    assert [play.name for play in panel([tmp_path], ["extra"])] == ["extra"]
    with pytest.raises(PlayError, match="no play named nope"):
        panel((), ["nope"])
    (tmp_path / "link.sh").symlink_to(tmp_path / "extra.sh")
    with pytest.raises(PlayError, match="not a regular file"):
        panel([tmp_path])


@given(st.text())
def test_the_survey_parse_is_total_and_keeps_paths_inside_the_work_dir(text: str) -> None:
    survey = parse_survey(text)
    for paths in survey.keeps.values():
        assert len(paths) <= MAX_KEEPS
        for path in paths:
            assert not path.startswith(("/", ".."))
            assert path != "."


def test_the_layouts_as_request_transforms() -> None:
    request = RolloutRequest(
        instruction="x", verify=["pytest"], verify_sandbox="same", verify_as="grader", solution_files=["a.py"]
    )
    mine = native(request, ["conftest.py", "a.py"])
    assert (mine.verify_sandbox, mine.verify_as, mine.solution_files) == ("same", "root", ["a.py", "conftest.py"])
    assert mine.verify == [unhardened("pytest")]
    theirs = ours(request)
    assert (theirs.verify_sandbox, theirs.verify_as, theirs.verify) == ("fresh", "grader", ["pytest"])


def result(reward: float | None, status: str = "completed", played: str = "[audit] play exited 0\n") -> RolloutResult:
    return RolloutResult.model_validate(
        {"status": status, "reward": reward, "solution_results": [{"cmd": "play", "exit_code": 0, "stdout": played}]}
    )


def test_a_play_is_admitted_only_above_doing_nothing_in_its_layout() -> None:
    assert outcome_of(result(1.0), result(0.0))[0] == "admitted"
    assert outcome_of(result(0.5), result(0.5))[0] == "blocked"
    assert outcome_of(result(None), result(None))[0] == "blocked"
    assert outcome_of(result(1.0, played="[audit] play exited 3\n"), result(0.0))[0] == "not_applicable"
    assert outcome_of(result(1.0, status="sandbox_error"), result(0.0))[0] == "error"
    assert outcome_of(result(1.0), result(None, status="sandbox_error"))[0] == "error"
    cut = result(0.0, status="agent_timeout", played="")
    assert outcome_of(cut, result(0.0)) == (
        "error",
        "the play did not finish, so its run says nothing (agent_timeout: None)",
    )
    finding = IntegrityFinding(path="conftest.py", kind="conftest", act="created", response="removed")
    blocked = result(0.0).model_copy(update={"integrity": [finding]})
    assert outcome_of(blocked, result(0.0)) == (
        "blocked",
        "reward 0.0, no more than doing nothing's 0.0; our grader recorded conftest",
    )


def test_a_hostile_survey_cannot_grow_the_request() -> None:
    lines = "\n".join(f"KEEP conftest-pass dir/{index}/conftest.py" for index in range(10_000))
    survey = parse_survey(lines + "\nKEEP conftest-pass " + "a" * 600 + "\nKEEP conftest-pass x/../../etc/passwd")
    kept = survey.keeps["conftest-pass"]
    assert len(kept) == MAX_KEEPS
    request = native(RolloutRequest(instruction="x", verify=["true"]), kept)
    assert request.solution_files == list(kept)


def test_a_verify_command_that_no_longer_fits_once_unhardened_is_refused_by_name() -> None:
    request = RolloutRequest(instruction="x", verify=["x" * MAX_COMMAND_CHARS])
    with pytest.raises(ValueError, match="verify"):
        native(request)


@given(st.lists(st.from_regex(r"[A-Za-z0-9._:@+/-]{0,256}", fullmatch=True), unique=True, max_size=20))
def test_task_ids_become_distinct_plain_file_names(task_ids: list[str]) -> None:
    names = [file_name(task_id) for task_id in task_ids]
    assert len(set(names)) == len(names)
    for name in names:
        assert name
        assert "/" not in name
        assert not name.startswith(".")


def test_the_evidence_keeps_the_play_s_exit_line_whatever_the_output_around_it() -> None:
    noisy = RolloutResult.model_validate(
        {
            "status": "completed",
            "solution_results": [
                {
                    "cmd": "play",
                    "exit_code": 0,
                    "stdout": "x" * 50_000 + "\n[audit] play exited 0\n",
                    "stderr": "e" * 50_000,
                }
            ],
            "verify_results": [{"cmd": "pytest", "exit_code": 1, "stdout": "F" * 50_000}],
        }
    )
    log = evidence_log(noisy)
    assert "[audit] play exited 0" in log
    assert "$ verify: pytest\n(exit 1)" in log
    assert len(log) < 7_000
