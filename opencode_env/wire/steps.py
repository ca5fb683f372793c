"""A multi-step rollout's parts: what each step asks (`RolloutStep`, in the request's `steps`), what each step did
(`StepResult`, in the result's `steps`), and the pure rules Harbor gives them: a step below its `min_reward` stops
the run, and the rollout's reward is the steps' mean or the final step's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from opencode_env.wire.shared import WireFloat

MAX_STEPS = 32
MAX_STEP_RESULT_CHARS = 2000
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=128)]


def _a_directory_name(name: str) -> str:
    if name in (".", ".."):
        raise ValueError(f"a step's name is its directory under steps/: {name!r} is not one")
    return name


StepName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$"),
    AfterValidator(_a_directory_name),
]
"""A step's directory under `steps/`: never `.` or `..`."""


def _numbers(value: object) -> object:
    """Each threshold as written is a number: `true` or `"0.5"` would otherwise be read as 1.0 or 0.5, silently."""
    thresholds = (
        {f"min_reward.{name}": threshold for name, threshold in value.items()}
        if isinstance(value, dict)
        else {"min_reward": value}
    )
    for where, threshold in thresholds.items():
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ValueError(f"{where}: {threshold!r} is not a number (a threshold, or a table of them by metric)")
    return value


def _finite(value: float | dict[str, float]) -> float | dict[str, float]:
    """A threshold is a finite number (the `reward`) or a table of them (one per metric, at most 64)."""
    thresholds = value if isinstance(value, dict) else {"reward": value}
    if len(thresholds) > 64:
        raise ValueError(f"min_reward: {len(thresholds)} metrics, over the limit of 64")
    for name, threshold in thresholds.items():
        if not math.isfinite(threshold):
            raise ValueError(f"min_reward: {name} = {threshold} is not a finite number")
    return value


MinReward = Annotated[float | dict[MetricName, float], BeforeValidator(_numbers), AfterValidator(_finite)]
"""Every min_reward (a request's step, a task.toml's step, a step's result) is checked by its type alone."""
StepReward = Literal["mean", "final"]
StepStatus = Literal["completed", "below_min_reward", "failed", "not_run"]
RewardSourceName = Literal["reward_json", "reward_txt", "verify_pass_rate", "tests", "none"]


class StepResult(BaseModel):
    """What one step did. Its agent's model calls are `proxy_turns[first_turn:end_turn]` of the rollout's result (each
    step's agent is a new OpenCode session; the proxy is drained between steps, so no call straddles two)."""

    model_config = ConfigDict(extra="ignore")

    name: StepName
    instruction: str = Field("", max_length=MAX_STEP_RESULT_CHARS, description="The start of the step's instruction.")
    status: StepStatus = Field(
        "not_run",
        description="completed; below_min_reward (graded under the step's min_reward: later steps not run); failed "
        "(its setup, agent or verify failed: the rollout's status and error say how; later steps not run); not_run.",
    )
    reward: WireFloat | None = Field(None, description="The step's grade (None when it was not graded).")
    reward_source: RewardSourceName = "none"
    reward_metrics: dict[MetricName, WireFloat] = Field(default_factory=dict, max_length=64)
    min_reward: MinReward | None = None
    error: str | None = Field(None, max_length=MAX_STEP_RESULT_CHARS)
    wall_s: WireFloat = Field(0.0, ge=0, description="Seconds from the step's setup to the end of its verify.")
    first_turn: int = Field(0, ge=0, description="Its agent's first model call's index in proxy_turns.")
    end_turn: int = Field(0, ge=0, description="One past its agent's last model call's index in proxy_turns.")
    agent_exit_code: int | None = None


def below_min_reward(min_reward: MinReward | None, reward: float | None, metrics: dict[str, float]) -> str | None:
    """Why a graded step stops the run (Harbor's rule: a missing reward or metric counts as -inf), or None."""
    if min_reward is None:
        return None
    thresholds = min_reward if isinstance(min_reward, dict) else {"reward": min_reward}
    got: dict[str, float | None] = {**metrics, "reward": reward}
    for name, threshold in thresholds.items():
        value = got.get(name)
        if value is None or not value >= threshold:
            shown = "missing" if value is None else f"{value:g}"
            return f"{name} {shown} is below the step's min_reward {threshold:g}"
    return None


def combined(steps: Sequence[StepResult], strategy: StepReward) -> tuple[float | None, dict[str, float]]:
    """The rollout's reward and metrics from its graded steps: `final`, the last graded step's; `mean`, each key's
    mean over the graded steps (a key a step lacks counts 0 there). None when no step was graded."""
    graded = [step for step in steps if step.reward is not None]
    if not graded:
        return None, {}
    if strategy == "final":
        return graded[-1].reward, dict(graded[-1].reward_metrics)
    keys = dict.fromkeys(key for step in graded for key in step.reward_metrics)
    metrics = {key: sum(step.reward_metrics.get(key, 0.0) for step in graded) / len(graded) for key in keys}
    return sum(step.reward or 0.0 for step in graded) / len(graded), metrics
