"""A rollout as step-wise samples: every completed agent and sub-agent turn its own sample, as the engine saw it.

Pure. A step is one model call: the engine's prompt ids, the completion ids it generated and their logprobs. No
turn is merged with another, so a chat template that re-renders the history (dropping earlier reasoning) or a
sub-agent's own conversation loses nothing: the steps carry every agent token of a usable rollout. Usability
follows the sequences' rules: an infrastructure failure makes every step unusable, and so do a turn's own ids
when they are missing or do not line up with its logprobs. Like a TRL row (formats.py), an unusable step keeps
its ids but has an all-zero `env_mask` and no reward.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pydantic import Field

from opencode_env.training.coverage import (
    Coverage,
    SessionKey,
    SessionKind,
    coverage,
    ids_problem,
    is_trainable_turn,
    rollout_failure,
    session_key,
)
from opencode_env.training.provenance_columns import ProvenanceColumns, provenance_columns
from opencode_env.wire import RolloutResult, RolloutStatus, RolloutTurn


class StepSample(ProvenanceColumns):
    """One model call as a training sample (the JSONL line of `opencode-env export --format steps`)."""

    prompt_ids: list[int] = Field(description="The engine's prompt ids of the call.")
    completion_ids: list[int]
    logprobs: list[float] = Field(description="One per completion id.")
    env_mask: list[int] = Field(description="All 1s (every completion id was generated); all 0s when unusable.")
    reward: float | None = Field(description="The rollout's reward; None when the step is unusable.")
    status: RolloutStatus
    task_id: str
    turn: int = Field(description="RolloutTurn.turn of the call.")
    session_turn_index: int = Field(description="Its index among its session's steps (0: the session's first).")
    kind: SessionKind
    session_id: str | None
    parent_session_id: str | None = Field(description="For a sub-agent's step: the session that started it.")
    usable: bool
    problem: str | None = Field(None, description="Why the step is unusable, or None.")
    rollout_index: int = Field(0, description="Index of the rollout in the batch it came from.")


def training_steps(result: RolloutResult, rollout_index: int = 0) -> list[StepSample]:
    """Every completed agent and sub-agent turn of the rollout as a step, in the rollout's order."""
    failure = rollout_failure(result)
    seen: Counter[SessionKey] = Counter()
    steps = []
    for position, turn in enumerate(result.proxy_turns):
        if is_trainable_turn(turn):
            key = session_key(result, position)
            steps.append(_step(result, turn, seen[key], failure, rollout_index))
            seen[key] += 1
    return steps


def training_steps_batch(results: Sequence[RolloutResult]) -> list[StepSample]:
    """The steps of many rollouts, each step carrying its rollout's index in `results`."""
    return [step for index, result in enumerate(results) for step in training_steps(result, rollout_index=index)]


def steps_coverage(result: RolloutResult, steps: Sequence[StepSample] | None = None) -> Coverage:
    """How many of the rollout's agent tokens its usable steps carry."""
    found = training_steps(result) if steps is None else steps
    return coverage(
        result,
        "steps",
        carried=(step.turn for step in found if step.usable),
        reasons={step.turn: step.problem or "" for step in found if not step.usable},
    )


def _step(
    result: RolloutResult, turn: RolloutTurn, session_turn_index: int, failure: str | None, rollout_index: int
) -> StepSample:
    problem = failure or ids_problem(turn)
    completion = list(turn.completion_token_ids)
    return StepSample(
        prompt_ids=list(turn.prompt_token_ids),
        completion_ids=completion,
        logprobs=list(turn.per_token_logps),
        env_mask=[0 if problem else 1] * len(completion),
        reward=None if problem else result.reward,
        status=result.status,
        task_id=result.task_id,
        turn=turn.turn,
        session_turn_index=session_turn_index,
        kind="agent" if turn.kind == "agent" else "sub_agent",
        session_id=turn.session_id,
        parent_session_id=turn.parent_session_id,
        usable=problem is None,
        problem=problem,
        rollout_index=rollout_index,
        **provenance_columns(result, [turn.turn]),
    )
