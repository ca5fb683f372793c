"""ATIF export: every trajectory validates against the JSON schema of Harbor's own `Trajectory` model (harbor 0.25.0,
generated with `Trajectory.model_json_schema()`; Harbor needs Python 3.12, so its package cannot be the reader here),
plus the rules its model validators add (step ids from 1, unique embedded ids, observations tied to their calls)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from opencode_env.cli import main
from opencode_env.training.atif import SCHEMA_VERSION, atif_trajectory
from opencode_env.wire import RolloutResult, RolloutTurn
from opencode_env.wire.provenance import Provenance

FIXTURES = Path(__file__).parents[1] / "fixtures"
SCHEMA = json.loads((FIXTURES / "atif" / "harbor-0.25.0-trajectory.schema.json").read_text())


def harbor_rules(trajectory: dict[str, Any]) -> None:
    """What Harbor's model validators check beyond the schema."""
    assert [step["step_id"] for step in trajectory["steps"]] == list(range(1, len(trajectory["steps"]) + 1))
    for step in trajectory["steps"]:
        if step["source"] != "agent":
            assert not {"model_name", "reasoning_content", "tool_calls", "metrics"} & set(step)
        calls = {call["tool_call_id"] for call in step.get("tool_calls", [])}
        for result in step.get("observation", {}).get("results", []):
            assert result.get("source_call_id") in calls | {None}
    embedded = [sub["trajectory_id"] for sub in trajectory.get("subagent_trajectories", [])]
    assert len(embedded) == len(set(embedded))
    assert all(embedded)
    for sub in trajectory.get("subagent_trajectories", []):
        harbor_rules(sub)


def validated(result: RolloutResult) -> dict[str, Any]:
    trajectory = json.loads(atif_trajectory(result).to_json())
    jsonschema.validate(trajectory, SCHEMA)
    harbor_rules(trajectory)
    return trajectory


def test_a_real_rollout_validates_with_its_token_ids_logprobs_and_tool_results() -> None:
    result = RolloutResult.model_validate_json((FIXTURES / "result_v0_demo.json").read_bytes())
    result.provenance = Provenance(policy_version="step-3", template_fingerprint="sha256:00")
    trajectory = validated(result)
    assert trajectory["schema_version"] == SCHEMA_VERSION == "ATIF-v1.8"
    agent_steps = [step for step in trajectory["steps"] if step["source"] == "agent"]
    agent_turns = [turn for turn in result.proxy_turns if turn.kind == "agent"]
    assert len(agent_steps) == len(agent_turns)
    for step, turn in zip(agent_steps, agent_turns, strict=True):
        assert step["metrics"]["completion_token_ids"] == turn.completion_token_ids
        assert step["metrics"]["prompt_token_ids"] == turn.prompt_token_ids
        assert step["metrics"]["logprobs"] == turn.per_token_logps
    observed = [step for step in agent_steps if "observation" in step]
    assert observed
    assert all(result["content"] for step in observed for result in step["observation"]["results"])
    assert trajectory["extra"]["provenance"]["policy_version"] == "step-3"
    assert trajectory["final_metrics"]["extra"]["reward"] == result.reward


def call(number: int, session: str, kind: str, tool: str | None, messages: list[Any], at: float) -> RolloutTurn:
    calls = [{"id": f"c{number}", "name": tool, "arguments": '{"prompt": "x"}'}] if tool else []
    return RolloutTurn(
        turn=number,
        kind=kind,  # type: ignore[arg-type]
        session_id=session,
        parent_session_id="ses_root" if kind == "sub_agent" else None,
        timestamp=at,
        completion_token_ids=[number, 2],
        per_token_logps=[-0.5, float("-inf")] if number == 3 else [-0.5, -0.25],
        prompt_token_ids=[7, 8],
        request={"messages": messages},
        response={"content": "", "tool_calls": calls} if calls else {"content": "done"},
        template_changed=number == 4,
    )


def test_a_sub_agent_is_an_embedded_trajectory_referenced_from_the_task_call_that_started_it() -> None:
    system, user = {"role": "system", "content": "You are OpenCode."}, {"role": "user", "content": "fix it"}
    task_result = {"role": "tool", "tool_call_id": "c1", "content": "sub-agent says done"}
    sub_user = {"role": "user", "content": "look at x"}
    result = RolloutResult(
        sandbox_id="sbx",
        proxy_turns=[
            call(0, "ses_root", "auxiliary", None, [user], 1.0),
            call(1, "ses_root", "agent", "task", [system, user], 2.0),
            call(2, "ses_child", "sub_agent", "read", [system, sub_user], 3.0),
            call(3, "ses_child", "sub_agent", None, [system, sub_user], 4.0),
            call(4, "ses_root", "agent", None, [system, user, {"role": "assistant", "content": ""}, task_result], 5.0),
        ],
    )
    trajectory = validated(result)
    [sub] = trajectory["subagent_trajectories"]
    assert sub["trajectory_id"] == "ses_child"
    assert [step["source"] for step in sub["steps"]] == ["system", "user", "agent", "agent"]
    assert "logprobs" not in sub["steps"][3]["metrics"]
    assert "logprobs_left_out" in sub["steps"][3]["metrics"]["extra"]
    [task_step] = [step for step in trajectory["steps"] if step.get("tool_calls")]
    [observed] = task_step["observation"]["results"]
    assert observed["subagent_trajectory_ref"] == [{"trajectory_id": "ses_child", "session_id": "ses_child"}]
    assert observed["content"] == "sub-agent says done"
    assert trajectory["extra"]["calls_not_steps"] == 1
    assert [step["metrics"]["extra"]["template_changed"] for step in trajectory["steps"] if "metrics" in step] == [
        False,
        True,
    ]


def test_a_broken_trajectory_is_refused_by_the_schema() -> None:
    """The schema is a real check: a step without its source fails it."""
    trajectory = json.loads(atif_trajectory(RolloutResult(sandbox_id="s")).to_json())
    del trajectory["steps"][0]["source"]
    with pytest.raises(jsonschema.ValidationError, match="source"):
        jsonschema.validate(trajectory, SCHEMA)


def test_the_cli_exports_atif_one_trajectory_per_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "trajectories.jsonl"
    assert main(["export", "--format", "atif", str(FIXTURES / "result_v0_demo.json"), "-o", str(output)]) == 0
    [line] = output.read_text().splitlines()
    jsonschema.validate(json.loads(line), SCHEMA)
    assert "1 ATIF trajectories (ATIF-v1.8" in capsys.readouterr().err
