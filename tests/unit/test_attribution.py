"""Calls not made by OpenCode's own session: marked "unattributed", left out of every training path, counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opencode_env.cli import main
from opencode_env.rollout.attribution import attribute_turns, attribution_check
from opencode_env.training.formats import training_rows, trl_batch
from opencode_env.training.sequences import training_sequences, training_summary
from opencode_env.wire import RolloutTurn, TurnKind
from tests.integration.test_training import history, result_of, turn

EOS = 99
STRANGER = [{"role": "user", "content": "a tool's own call"}]


def call(
    number: int,
    session: str | None,
    kind: TurnKind = "agent",
    prompt: list[int] | None = None,
    completion: list[int] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> RolloutTurn:
    """A turn as the proxy records it: lower-case header names, the key redacted."""
    recorded = turn(number, prompt or [1, 2, 3], completion or [10, EOS], kind=kind, messages=messages)
    headers = {"authorization": "[redacted]", "user-agent": "opencode/1.0"}
    if session is not None:
        headers["x-session-id"] = session
    recorded.headers = headers
    return recorded


def kinds(turns: list[RolloutTurn]) -> list[str]:
    return [turn.kind for turn in turns]


def test_calls_without_opencodes_session_are_marked_and_counted() -> None:
    """Without the caller check (E2B, HF) only the root session is OpenCode's; an auxiliary call (no tools) outside
    it is no more OpenCode's than an agent call."""
    turns = [
        call(0, "ses_A"),
        call(1, None, kind="auxiliary"),
        call(2, "ses_A"),
        call(3, None),
        call(4, "ses_B"),
        call(5, "ses_C", kind="sub_agent"),
        call(6, ""),
    ]
    assert attribute_turns(turns) == 5
    assert kinds(turns) == [
        "agent",
        "unattributed",
        "agent",
        "unattributed",
        "unattributed",
        "unattributed",
        "unattributed",
    ]


def test_opencodes_session_is_the_first_agent_turn_that_names_one() -> None:
    """A call without the header before OpenCode's first (a process started by setup) cannot take its place."""
    turns = [call(0, None, kind="auxiliary"), call(1, None), call(2, "ses_A"), call(3, "ses_A"), call(4, "ses_B")]
    assert attribute_turns(turns) == 3
    assert kinds(turns) == ["unattributed", "unattributed", "agent", "agent", "unattributed"]


def test_without_any_session_every_agent_turn_is_unattributed() -> None:
    turns = [call(0, None), call(1, None, kind="auxiliary"), call(2, None)]
    assert attribute_turns(turns) == 3
    assert kinds(turns) == ["unattributed", "unattributed", "unattributed"]


def test_opencodes_own_rollout_has_nothing_to_mark_and_a_second_pass_marks_nothing_more() -> None:
    own = [call(0, "ses_A"), call(1, "ses_A", kind="auxiliary"), call(2, "ses_A")]
    assert attribute_turns(own) == 0
    assert kinds(own) == ["agent", "auxiliary", "agent"]
    mixed = [call(0, "ses_A"), call(1, "ses_B")]
    assert (attribute_turns(mixed), attribute_turns(mixed)) == (1, 0)
    assert attribute_turns([]) == 0


def mixed_rollout() -> list[RolloutTurn]:
    """Two OpenCode turns extending one sequence, and between them a stranger's call whose ids would extend it too."""
    return [
        call(0, "ses_A", prompt=[1, 2, 3], completion=[10, EOS], messages=history(0)),
        call(1, "ses_X", prompt=[1, 2, 3, 10, EOS, 60], completion=[61, EOS], messages=STRANGER),
        call(2, "ses_A", prompt=[1, 2, 3, 10, EOS, 50], completion=[11, EOS], messages=history(1)),
    ]


def test_unattributed_turns_are_in_no_sequence_and_the_summary_counts_them() -> None:
    turns = mixed_rollout()
    attribute_turns(turns)
    result = result_of(*turns)
    found = training_sequences(result)
    assert [sequence.turns for sequence in found.sequences] == [[0, 2]]
    assert found.sequences[0].completion_ids == [10, EOS, 50, 11, EOS]
    assert (found.forks, found.skipped, found.unattributed) == ([], [], [1])
    summary = training_summary(result, found)
    assert summary.unattributed == [1]
    assert summary.usage_by_kind["unattributed"].calls == 1
    assert "unattributed: turns [1]" in summary.text()


def test_trl_rows_leave_unattributed_turns_out_and_list_them() -> None:
    """The OpenEnv harness export of the same rollout is tested with the other formats (openenv imports gradio)."""
    turns = mixed_rollout()
    attribute_turns(turns)
    result = result_of(*turns)
    batch = trl_batch([result], filler_token_id=EOS)
    assert batch["completion_ids"] == [[10, EOS, 50, 11, EOS]]
    assert (batch["dropped_turns"], batch["unattributed_turns"]) == ([[]], [[1]])
    assert [row.turns for row in training_rows([result], every_sequence=True)] == [[0, 2]]


def test_a_rollout_of_unattributed_calls_only_has_a_masked_row_that_says_why() -> None:
    turns = [call(0, None), call(1, None, prompt=[1, 2, 3, 10, EOS, 50])]
    attribute_turns(turns)
    result = result_of(*turns)
    found = training_sequences(result)
    assert found.sequences == []
    assert "unattributed" in (found.no_sequences_reason or "")
    [row] = training_rows([result], filler_token_id=EOS)
    assert (row.usable, row.env_mask, row.dropped_turns, row.unattributed_turns) == (False, [0], [], [0, 1])


def test_export_counts_the_unattributed_calls_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    turns = mixed_rollout()
    attribute_turns(turns)
    path = tmp_path / "result.json"
    path.write_text(result_of(*turns).model_dump_json())
    assert main(["export", "--format", "trl", str(path)]) == 0
    captured = capsys.readouterr()
    [row] = [json.loads(line) for line in captured.out.splitlines()]
    assert (row["turns"], row["unattributed_turns"]) == ([0, 2], [1])
    assert "1 rows (1 usable, 0 not) from 1 rollouts (0 not completed, 1 unattributed calls)" in captured.err


@pytest.mark.parametrize("callers_checked", [True, False])
def test_each_step_of_a_multi_step_rollout_has_a_root_of_its_own(callers_checked: bool) -> None:
    """OpenCode runs once per step: the first session of each run (from `starts`) is a root, its calls `agent`; a
    sub-agent's stays a sub-agent where callers were checked, and without the check only the roots are OpenCode's."""
    turns = [call(0, "ses_A"), call(1, "ses_S"), call(2, "ses_A"), call(3, "ses_B"), call(4, "ses_B")]
    check, _ = attribution_check(turns, callers_checked=callers_checked, starts=[3])
    if callers_checked:
        assert kinds(turns) == ["agent", "sub_agent", "agent", "agent", "agent"]
        assert (check.sessions, check.sub_agent_sessions) == (3, 1)
    else:
        assert kinds(turns) == ["agent", "unattributed", "agent", "agent", "agent"]
        assert (check.sessions, check.sub_agent_sessions) == (2, 0)
    attribution_check(turns, callers_checked=True)
    assert kinds(turns)[3:] == ["sub_agent", "sub_agent"], "without the steps' starts, one root"
