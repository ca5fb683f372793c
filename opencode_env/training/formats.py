"""The shapes trainers consume, built from rollouts: TRL GRPOTrainer rows (`rollout_func`, checked against trl 1.16.0)
and OpenEnv's HarnessRolloutResult. Pure: results in, rows out. A failed rollout still gives its row (TRL needs
`num_generations` per prompt), with nothing of it trained on; each row says how many of the rollout's agent tokens
it carries. The row's keys and why are in docs/training.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from opencode_env.training.coverage import SessionKind, agent_tokens_carried, is_root_agent_turn, is_trainable_turn
from opencode_env.training.provenance_columns import ProvenanceColumns, provenance_columns
from opencode_env.training.sequences import TrainingSequence, TrainingSequences, training_sequences
from opencode_env.wire import RolloutResult, RolloutStatus, is_infrastructure_failure
from opencode_env.wire.grading import tampering

if TYPE_CHECKING:
    from openenv.core.harness import HarnessRolloutResult


class TrainingRow(ProvenanceColumns):
    """One row of a trainer's batch (the JSONL line of `opencode-env export`)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float | None
    status: RolloutStatus
    task_id: str
    usable: bool
    problem: str | None = Field(None, description="Why the row is unusable, or None.")
    rollout_index: int = Field(description="Index of the rollout in the group it came from.")
    sequence_index: int = Field(0, description="Index of the sequence within its rollout.")
    kind: SessionKind = Field("agent", description="agent: the root session's sequence; sub_agent: a sub-agent's.")
    session_id: str | None = None
    parent_session_id: str | None = Field(None, description="For a sub-agent's sequence: the session that started it.")
    turns: list[int] = Field(default_factory=list)
    dropped_turns: list[int] = Field(
        default_factory=list, description="Completed agent and sub-agent turns of the rollout that are not in this row."
    )
    agent_tokens: int = Field(0, description="The rollout's agent tokens (completed agent and sub-agent turns).")
    covered_tokens: int = Field(0, description="How many of them this row carries as trainable tokens.")
    unattributed_turns: list[int] = Field(
        default_factory=list,
        description="Calls of the rollout not tied to OpenCode's session: in no row, listed so coverage adds up.",
    )
    forks: int = 0
    grader_tampering: list[str] = Field(
        default_factory=list,
        description="Kinds of grader configuration the agent created, changed or deleted (the result's integrity "
        "findings, routine bytecode left out): a reward-hacking attempt a trainer can penalise.",
    )
    grade_isolation: str = Field(
        "none", description="Where the reward was graded (the result's grade_isolation): filter on fresh_box."
    )


TRL_KEYS = ("prompt_ids", "completion_ids", "logprobs", "env_mask")
TRL_EXTRA_KEYS = (
    "reward",
    "status",
    "task_id",
    "usable",
    "problem",
    "dropped_turns",
    "agent_tokens",
    "covered_tokens",
    "unattributed_turns",
    "policy_version",
    "template_changed_turns",
    "config_sha256",
    "forks",
    "rollout_index",
    "grader_tampering",
    "grade_isolation",
)


ORACLE_PROBLEM = "an oracle run: the task's solution ran, no model was called, nothing to train on"


def _row(
    result: RolloutResult,
    found: TrainingSequences,
    sequence: TrainingSequence | None,
    *,
    rollout_index: int,
    filler_token_id: int,
) -> TrainingRow:
    agent_turns = [t.turn for t in result.proxy_turns if is_trainable_turn(t)]
    covered_tokens, agent_tokens = agent_tokens_carried(
        result, sequence.turns if sequence is not None and sequence.usable else []
    )
    common = {
        "status": result.status,
        "task_id": result.task_id,
        "rollout_index": rollout_index,
        "forks": len(found.forks),
        "unattributed_turns": found.unattributed,
        "agent_tokens": agent_tokens,
        "covered_tokens": covered_tokens,
        "grader_tampering": tampering(result.integrity),
        "grade_isolation": result.grade_isolation,
    }
    if sequence is None:
        common |= provenance_columns(result, agent_turns)
        first_prompt = next((t.prompt_token_ids for t in result.proxy_turns if t.prompt_token_ids), [])
        return TrainingRow(
            prompt_ids=list(first_prompt) or [filler_token_id],
            completion_ids=[filler_token_id],
            logprobs=[0.0],
            env_mask=[0],
            reward=None,
            usable=False,
            problem=ORACLE_PROBLEM if result.oracle else _no_sequence_problem(result, found),
            dropped_turns=agent_turns,
            **common,
        )
    usable, covered = sequence.usable, set(sequence.turns)
    return TrainingRow(
        prompt_ids=sequence.prompt_ids,
        completion_ids=sequence.completion_ids,
        logprobs=sequence.logprobs,
        env_mask=sequence.env_mask if usable else [0] * len(sequence.env_mask),
        reward=sequence.reward if usable else None,
        usable=usable,
        problem=sequence.unusable_reason,
        sequence_index=found.sequences.index(sequence),
        kind=sequence.kind,
        session_id=sequence.session_id,
        parent_session_id=sequence.parent_session_id,
        turns=sequence.turns,
        dropped_turns=[t for t in agent_turns if t not in covered],
        **common,
        **provenance_columns(result, sequence.turns),
    )


def _no_sequence_problem(result: RolloutResult, found: TrainingSequences) -> str:
    if found.sequences:
        return "the root agent has no usable turn (only sub-agents' sequences: export sequences or steps)"
    return found.no_sequences_reason or result.error or f"no sequence ({result.status})"


def training_rows(
    results: Sequence[RolloutResult], *, every_sequence: bool = False, filler_token_id: int = 0
) -> list[TrainingRow]:
    """One row per rollout (its final sequence), or one per sequence of every session when `every_sequence` (for
    offline use)."""
    rows: list[TrainingRow] = []
    for index, result in enumerate(results):
        found = training_sequences(result)
        if every_sequence and found.sequences:
            rows += [
                _row(result, found, s, rollout_index=index, filler_token_id=filler_token_id) for s in found.sequences
            ]
        else:
            rows.append(_row(result, found, found.final(), rollout_index=index, filler_token_id=filler_token_id))
    return rows


def trl_batch(results: Sequence[RolloutResult], *, filler_token_id: int = 0) -> dict[str, list[Any]]:
    """GRPOTrainer's rollout_func return value: one row per result, in order (see the module docstring)."""
    rows = training_rows(results, filler_token_id=filler_token_id)
    return {key: [getattr(row, key) for row in rows] for key in (*TRL_KEYS, *TRL_EXTRA_KEYS)}


def rollout_reward(
    completions: Sequence[Any], reward: Sequence[float | None], usable: Sequence[bool], **_: Any
) -> list[float | None]:
    """A TRL reward function: the environment's reward for a usable row, None (unscorable) otherwise."""
    return [r if ok else None for r, ok in zip(reward, usable, strict=True)]


def harness_result(result: RolloutResult) -> HarnessRolloutResult:
    """The rollout as openenv-core's `openenv.core.harness.HarnessRolloutResult` (0.3.0).

    Ids and logprobs are the final sequence's; its env_mask, the reward and the row's status go in `metrics`
    (the dataclass has no mask field). `done` is True when the episode ran to an end (not an infrastructure failure).
    """
    from openenv.core.harness import HarnessRolloutResult, RolloutEvent, ToolResult, ToolTraceEntry

    found = training_sequences(result)
    row = _row(result, found, found.final(), rollout_index=0, filler_token_id=0)
    has_sequence = found.final() is not None
    messages: list[dict[str, Any]] = []
    last_agent = next(
        (i for i in reversed(range(len(result.proxy_turns))) if is_root_agent_turn(result.proxy_turns[i])), None
    )
    if last_agent is not None:
        messages = [*result.turn_messages(last_agent), {"role": "assistant", **result.proxy_turns[last_agent].response}]
    tool_trace = [
        ToolTraceEntry(
            tool_name=call.tool,
            arguments={},
            result=ToolResult(
                data=call.title,
                metadata={"status": call.status, "exit_code": call.exit_code},
                error=None if call.status == "completed" else call.status,
            ),
        )
        for call in result.tool_calls
    ]
    events = [RolloutEvent(type="fork", payload=fork.model_dump()) for fork in found.forks]
    return HarnessRolloutResult(
        messages=messages,
        tool_trace=tool_trace,
        events=events,
        done=not is_infrastructure_failure(result.status),
        metrics={
            "env_reward": result.reward,
            "reward_source": result.reward_source,
            "status": result.status,
            "task_id": result.task_id,
            "usable": row.usable,
            "problem": row.problem,
            "env_mask": row.env_mask if has_sequence else [],
            "forks": len(found.forks),
            "dropped_turns": row.dropped_turns,
            "agent_tokens": row.agent_tokens,
            "covered_tokens": row.covered_tokens,
            "unattributed_turns": row.unattributed_turns,
            "grader_tampering": row.grader_tampering,
            "grade_isolation": row.grade_isolation,
        },
        prompt_ids=row.prompt_ids if has_sequence else [],
        completion_ids=row.completion_ids if has_sequence else [],
        logprobs=row.logprobs if has_sequence else [],
    )
