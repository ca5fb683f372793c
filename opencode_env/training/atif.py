"""`opencode-env export --format atif`: rollouts as Harbor's Agent Trajectory Interchange Format (ATIF-v1.8), one
trajectory per rollout, one JSON document per line.

Each completed call of the root agent is an agent step with its prompt and completion token ids and per-token
logprobs in `metrics` (the fields ATIF added for RL); the tool results OpenCode sent back on the next call are the
step's observation. Sub-agents (OpenCode's task tool, tied to their parent session by our attribution) are embedded
trajectories in `subagent_trajectories`, referenced from the observation of the parent's task call that started
them (matched in order of start). Auxiliary calls (titles, summaries) and calls OpenCode did not make are no steps.
Provenance, reward, status and per-turn flags (template_changed, policy_version) travel in the `extra` objects.

The models here are our own, written from the spec (Harbor's RFC 0001 and its pydantic models, read as reference);
tests validate the output against the JSON schema of Harbor's `Trajectory` model.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field

from opencode_env.wire import RolloutResult, RolloutTurn

SCHEMA_VERSION = "ATIF-v1.8"
AGENT_NAME = "opencode"
TASK_TOOL = "task"


class _Atif(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AtifToolCall(_Atif):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]


class AtifSubagentRef(_Atif):
    trajectory_id: str
    session_id: str | None = None


class AtifObservationResult(_Atif):
    source_call_id: str | None = None
    content: str | None = None
    subagent_trajectory_ref: list[AtifSubagentRef] | None = None


class AtifObservation(_Atif):
    results: list[AtifObservationResult]


class AtifMetrics(_Atif):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class AtifStep(_Atif):
    step_id: int = Field(ge=1)
    source: Literal["system", "user", "agent"]
    message: str
    timestamp: str | None = None
    model_name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[AtifToolCall] | None = None
    observation: AtifObservation | None = None
    metrics: AtifMetrics | None = None
    llm_call_count: int | None = None
    extra: dict[str, Any] | None = None


class AtifAgent(_Atif):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class AtifFinalMetrics(_Atif):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_steps: int | None = None
    extra: dict[str, Any] | None = None


class AtifTrajectory(_Atif):
    schema_version: str = SCHEMA_VERSION
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: AtifAgent
    steps: list[AtifStep] = Field(min_length=1)
    final_metrics: AtifFinalMetrics | None = None
    extra: dict[str, Any] | None = None
    subagent_trajectories: list[AtifTrajectory] | None = None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


def _iso(timestamp: float) -> str | None:
    return datetime.fromtimestamp(timestamp, UTC).isoformat() if timestamp > 0 else None


def _arguments(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        return {"_unparsed": text}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _tool_calls(turn: RolloutTurn) -> list[AtifToolCall]:
    calls = turn.response.get("tool_calls") or []
    return [
        AtifToolCall(
            tool_call_id=str(call.get("id") or f"turn{turn.turn}_call{index}"),
            function_name=str(call.get("name", "")),
            arguments=_arguments(str(call.get("arguments", ""))),
        )
        for index, call in enumerate(calls)
        if isinstance(call, dict)
    ]


def _metrics(turn: RolloutTurn) -> AtifMetrics:
    finite = all(math.isfinite(value) for value in turn.per_token_logps)
    flags: dict[str, Any] = {
        "turn": turn.turn,
        "kind": turn.kind,
        "finish_reason": turn.finish_reason,
        "token_id_source": turn.token_id_source,
        "aligned": turn.aligned,
        "prompt_source": turn.prompt_source,
        "template_fingerprint": turn.template_fingerprint,
        "template_changed": turn.template_changed,
        "policy_version": turn.policy_version,
    }
    if not finite:
        flags["logprobs_left_out"] = "a logprob is not finite (JSON has no -inf): see the RolloutResult"
    return AtifMetrics(
        prompt_tokens=turn.usage.prompt_tokens,
        completion_tokens=turn.usage.completion_tokens,
        prompt_token_ids=turn.prompt_token_ids or None,
        completion_token_ids=turn.completion_token_ids or None,
        logprobs=list(turn.per_token_logps) if turn.per_token_logps and finite else None,
        extra=flags,
    )


def _tool_results(messages: Iterable[list[Any]]) -> dict[str, str]:
    """What each tool call returned, by call id, from the messages OpenCode sent on later calls."""
    results: dict[str, str] = {}
    for turn_messages in messages:
        for message in turn_messages:
            if isinstance(message, dict) and message.get("role") == "tool" and message.get("tool_call_id"):
                results.setdefault(str(message["tool_call_id"]), _text(message.get("content")))
    return results


def _opening_steps(messages: list[Any], instruction: str | None) -> list[AtifStep]:
    steps = []
    first = messages[0] if messages and isinstance(messages[0], dict) else None
    if first is not None and first.get("role") == "system":
        steps.append(AtifStep(step_id=1, source="system", message=_text(first.get("content"))))
    user = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
    text = instruction if instruction is not None else _text(user.get("content")) if user else ""
    steps.append(AtifStep(step_id=len(steps) + 1, source="user", message=text))
    return steps


def _steps(
    turns: list[tuple[RolloutTurn, list[Any]]],
    results: dict[str, str],
    instruction: str | None,
    model: str,
    children: list[str],
) -> list[AtifStep]:
    steps = _opening_steps(turns[0][1], instruction) if turns else [AtifStep(step_id=1, source="user", message="")]
    unstarted = list(children)
    for turn, _ in turns:
        calls = _tool_calls(turn)
        observed = []
        for call in calls:
            refs = None
            if call.function_name == TASK_TOOL and unstarted:
                child = unstarted.pop(0)
                refs = [AtifSubagentRef(trajectory_id=child, session_id=child)]
            if call.tool_call_id in results or refs:
                observed.append(
                    AtifObservationResult(
                        source_call_id=call.tool_call_id,
                        content=results.get(call.tool_call_id),
                        subagent_trajectory_ref=refs,
                    )
                )
        steps.append(
            AtifStep(
                step_id=len(steps) + 1,
                source="agent",
                message=_text(turn.response.get("content")),
                timestamp=_iso(turn.timestamp),
                model_name=model or None,
                reasoning_content=turn.response.get("reasoning") or None,
                tool_calls=calls or None,
                observation=AtifObservation(results=observed) if observed else None,
                metrics=_metrics(turn),
                llm_call_count=1,
            )
        )
    return steps


def _tool_definitions(result: RolloutResult, turns: list[RolloutTurn]) -> list[dict[str, Any]] | None:
    key = next((turn.tools_sha256 for turn in turns if turn.tools_sha256), None)
    tools = result.request_tools.get(key, []) if key else []
    return [tool for tool in tools if isinstance(tool, dict)] or None


def _totals(turns: list[RolloutTurn], steps: int, extra: dict[str, Any] | None = None) -> AtifFinalMetrics:
    return AtifFinalMetrics(
        total_prompt_tokens=sum(turn.usage.prompt_tokens or 0 for turn in turns),
        total_completion_tokens=sum(turn.usage.completion_tokens or 0 for turn in turns),
        total_steps=steps,
        extra=extra,
    )


def _subagent(
    session: str, turns: list[tuple[RolloutTurn, list[Any]]], results: dict[str, str], model: str, version: str
) -> AtifTrajectory:
    steps = _steps(turns, results, None, model, [])
    return AtifTrajectory(
        session_id=session,
        trajectory_id=session,
        agent=AtifAgent(name=AGENT_NAME, version=version, model_name=model or None, extra={"sub_agent": True}),
        steps=steps,
        final_metrics=_totals([turn for turn, _ in turns], len(steps)),
        extra={"parent_session_id": turns[0][0].parent_session_id},
    )


def atif_trajectory(result: RolloutResult) -> AtifTrajectory:
    """One rollout as one ATIF trajectory, its sub-agents embedded."""
    all_messages = result.all_turn_messages()
    indexed = list(zip(result.proxy_turns, all_messages, strict=True))
    trained = [(turn, messages) for turn, messages in indexed if turn.outcome == "complete"]
    root = [(t, m) for t, m in trained if t.kind == "agent"]
    root_session = next((turn.session_id for turn, _ in root if turn.session_id), None)
    sessions: dict[str, list[tuple[RolloutTurn, list[Any]]]] = {}
    for turn, messages in trained:
        if turn.kind == "sub_agent" and turn.session_id:
            sessions.setdefault(turn.session_id, []).append((turn, messages))
    children = sorted(sessions, key=lambda session: sessions[session][0][0].timestamp)
    results = _tool_results(all_messages)
    model = result.upstream.model
    version = result.opencode_version or "unknown"
    tools = _tool_definitions(result, [turn for turn, _ in root])
    subagents = [_subagent(session, sessions[session], results, model, version) for session in children]
    instruction = result.task.instruction if result.task is not None else None
    steps = _steps(root, results, instruction, model, children)
    skipped = [turn for turn in result.proxy_turns if turn.kind in ("auxiliary", "unattributed")]
    return AtifTrajectory(
        session_id=root_session or result.sandbox_id or None,
        trajectory_id=result.sandbox_id or None,
        agent=AtifAgent(
            name=AGENT_NAME,
            version=version,
            model_name=model or None,
            tool_definitions=tools,
            extra={"mode": result.mode, "backend": result.backend},
        ),
        steps=steps,
        final_metrics=_totals(
            [turn for turn, _ in root],
            len(steps),
            {"reward": result.reward, "reward_source": result.reward_source, "status": result.status},
        ),
        extra={
            "producer": "opencode-env",
            "task_id": result.task_id,
            "status": result.status,
            "warnings": result.warnings,
            "calls_not_steps": len(skipped),
            "provenance": result.provenance.model_dump(mode="json") if result.provenance else None,
        },
        subagent_trajectories=subagents or None,
    )


def write_atif(results: Iterable[RolloutResult], out: TextIO) -> int:
    """Write one trajectory per line; returns how many."""
    count = 0
    for result in results:
        out.write(atif_trajectory(result).to_json() + "\n")
        count += 1
    return count


def export_atif(results: list[RolloutResult], output: Path | None) -> int:
    """`export --format atif`: the trajectories to `output` (stdout without one), a count on stderr."""
    if output is None:
        count = write_atif(results, sys.stdout)
    else:
        with output.open("w") as out:
            count = write_atif(results, out)
    sub_agents = sum(len({t.session_id for t in r.proxy_turns if t.kind == "sub_agent"}) for r in results)
    print(
        f"{count} ATIF trajectories ({SCHEMA_VERSION}, {sub_agents} sub-agent trajectories embedded)", file=sys.stderr
    )
    return 0
