"""Pure aggregation of an eval's attempts: pass@k, success counts, rewards, statuses, tokens. No I/O.

An attempt is scored unless it ended in an infrastructure failure (`is_infrastructure_failure`): such an attempt
says nothing about the policy, so it is counted apart and never scored. A scored attempt succeeds when its reward
reaches the threshold; a scored attempt without a reward (setup failed, say) counts as reward 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from statistics import fmean

from pydantic import BaseModel, Field, computed_field

from opencode_env.wire import RolloutResult, RolloutStatus, WireFloat, is_infrastructure_failure


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n attempts of which c succeeded: the chance that k attempts drawn
    without replacement include a success, 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1..n} (1 - k/i)
    so that no binomial coefficient is ever formed."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        all_fail *= 1.0 - k / i
    return 1.0 - all_fail


class AttemptOutcome(BaseModel):
    """What the summary keeps of one attempt's result."""

    attempt: int = Field(ge=1, description="The attempt's number, 1 to k.")
    status: RolloutStatus
    reward: WireFloat | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    wall_s: WireFloat = Field(0.0, description="The rollout's own wall-clock seconds.")

    @classmethod
    def of(cls, result: RolloutResult, attempt: int) -> AttemptOutcome:
        return cls(
            attempt=attempt,
            status=result.status,
            reward=result.reward,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            llm_calls=result.usage.llm_calls,
            wall_s=result.wall_s,
        )

    @property
    def scored(self) -> bool:
        return not is_infrastructure_failure(self.status)

    def succeeded(self, threshold: float) -> bool:
        return self.scored and self.reward is not None and self.reward >= threshold


class Tally(BaseModel):
    """Counts over a set of attempts (one task's, or every task's)."""

    attempts: int = Field(description="Attempts with a result, scored or not.")
    scored: int = Field(description="Attempts that did not end in an infrastructure failure.")
    successes: int = Field(description="Scored attempts whose reward reached the threshold.")
    pass_at_1: WireFloat | None = Field(description="None without a scored attempt.")
    pass_at_k: WireFloat | None = Field(description="None without a scored attempt.")
    mean_reward: WireFloat | None = Field(description="Over the scored attempts (no reward counts 0).")
    statuses: dict[str, int] = Field(description="Scored attempts by status.")
    infrastructure_failures: dict[str, int] = Field(description="Attempts that failed on our side, by status.")
    prompt_tokens: int = Field(description="Over every attempt, scored or not.")
    completion_tokens: int = Field(description="Over every attempt, scored or not.")
    llm_calls: int = Field(description="Over every attempt, scored or not.")
    rollout_s: WireFloat = Field(description="The attempts' wall-clock seconds, added up.")

    @computed_field(description="Prompt and completion tokens.")  # type: ignore[prop-decorator]
    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TaskSummary(Tally):
    task_id: str
    k_used: int = Field(description="The k of pass_at_k: k, or the scored attempts when there are fewer (pass@n).")
    outcomes: list[AttemptOutcome] = Field(description="Each attempt with a result, by attempt number.")


class EvalSummary(BaseModel):
    k: int
    threshold: WireFloat
    model: str = Field("", description="The model the attempts ran (as the eval's configuration names it).")
    tasks: list[TaskSummary]
    overall: Tally = Field(
        description="Sums over every task; pass_at_1 and pass_at_k are means over the tasks with a scored attempt, "
        "mean_reward is over every scored attempt."
    )
    reduced_k: list[str] = Field(description="Tasks whose pass_at_k is pass@n, with n < k scored attempts.")
    run_wall_s: WireFloat = Field(0.0, description="Wall-clock seconds of the run that wrote this summary.")
    broken: list[str] = Field(
        default_factory=list, description="The inputs not run, each as 'where: why' (a task that does not load)."
    )

    def table(self) -> str:
        return format_table(self)


def _counts(outcomes: Sequence[AttemptOutcome], *, scored: bool) -> dict[str, int]:
    return dict(Counter(outcome.status for outcome in outcomes if outcome.scored == scored))


def _token_sums(outcomes: Sequence[AttemptOutcome]) -> dict[str, int]:
    return {
        "prompt_tokens": sum(outcome.prompt_tokens for outcome in outcomes),
        "completion_tokens": sum(outcome.completion_tokens for outcome in outcomes),
        "llm_calls": sum(outcome.llm_calls for outcome in outcomes),
    }


def _mean_reward(scored: Sequence[AttemptOutcome]) -> float | None:
    return fmean(outcome.reward or 0.0 for outcome in scored) if scored else None


def summarize_task(task_id: str, outcomes: Sequence[AttemptOutcome], *, k: int, threshold: float) -> TaskSummary:
    scored = [outcome for outcome in outcomes if outcome.scored]
    n, c = len(scored), sum(outcome.succeeded(threshold) for outcome in scored)
    k_used = min(k, n)
    return TaskSummary(
        task_id=task_id,
        k_used=k_used,
        outcomes=sorted(outcomes, key=lambda outcome: outcome.attempt),
        attempts=len(outcomes),
        scored=n,
        successes=c,
        pass_at_1=pass_at_k(n, c, 1) if n else None,
        pass_at_k=pass_at_k(n, c, k_used) if n else None,
        mean_reward=_mean_reward(scored),
        statuses=_counts(outcomes, scored=True),
        infrastructure_failures=_counts(outcomes, scored=False),
        rollout_s=sum(outcome.wall_s for outcome in outcomes),
        **_token_sums(outcomes),
    )


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return fmean(present) if present else None


def _overall(tasks: Sequence[TaskSummary]) -> Tally:
    outcomes = [outcome for task in tasks for outcome in task.outcomes]
    return Tally(
        attempts=len(outcomes),
        scored=sum(task.scored for task in tasks),
        successes=sum(task.successes for task in tasks),
        pass_at_1=_mean_or_none([task.pass_at_1 for task in tasks]),
        pass_at_k=_mean_or_none([task.pass_at_k for task in tasks]),
        mean_reward=_mean_reward([outcome for outcome in outcomes if outcome.scored]),
        statuses=_counts(outcomes, scored=True),
        infrastructure_failures=_counts(outcomes, scored=False),
        rollout_s=sum(outcome.wall_s for outcome in outcomes),
        **_token_sums(outcomes),
    )


def summarize(
    outcomes_by_task: Mapping[str, Sequence[AttemptOutcome]],
    *,
    k: int,
    threshold: float,
    model: str = "",
    run_wall_s: float = 0.0,
) -> EvalSummary:
    """The summary of an eval, tasks in the mapping's order."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    tasks = [
        summarize_task(task_id, outcomes, k=k, threshold=threshold) for task_id, outcomes in outcomes_by_task.items()
    ]
    return EvalSummary(
        k=k,
        threshold=threshold,
        model=model,
        tasks=tasks,
        overall=_overall(tasks),
        reduced_k=[task.task_id for task in tasks if 0 < task.k_used < k],
        run_wall_s=run_wall_s,
    )


def summarize_results(
    results_by_task: Mapping[str, Sequence[RolloutResult]], *, k: int, threshold: float, model: str = ""
) -> EvalSummary:
    """The summary of results held in memory, each task's attempts numbered by their position."""
    outcomes = {
        task_id: [AttemptOutcome.of(result, number) for number, result in enumerate(results, start=1)]
        for task_id, results in results_by_task.items()
    }
    return summarize(outcomes, k=k, threshold=threshold, model=model)


def number(value: float | None) -> str:
    """A rate or mean as the table and the index page show it: three decimals, '-' for none."""
    return "-" if value is None else f"{value:.3f}"


def _statuses(tally: Tally) -> str:
    scored = ", ".join(f"{status} {count}" for status, count in sorted(tally.statuses.items()))
    infra = ", ".join(f"{status} {count}" for status, count in sorted(tally.infrastructure_failures.items()))
    return scored + (f"; infrastructure: {infra}" if infra else "")


def column_names(k: int) -> list[str]:
    """The columns after a row's name; at k = 1 pass@k is pass@1, shown once."""
    pass_k = [f"pass@{k}"] if k > 1 else []
    return ["attempts", "scored", "successes", "pass@1", *pass_k, "mean reward", "infra", "tokens", "rollout s"]


def tally_cells(tally: Tally, pass_k: str | None) -> list[str]:
    """A tally's columns after its name, in the table's order (the index page shows the same); `pass_k` None at
    k = 1 (no column of its own)."""
    return [
        str(tally.attempts),
        str(tally.scored),
        str(tally.successes),
        number(tally.pass_at_1),
        *([] if pass_k is None else [pass_k]),
        number(tally.mean_reward),
        str(sum(tally.infrastructure_failures.values())),
        str(tally.total_tokens),
        f"{tally.rollout_s:.1f}",
    ]


def format_table(summary: EvalSummary) -> str:
    """The summary as a plain-text table, one row per task and one for all, with the status counts below."""
    header = ["task", *column_names(summary.k)]
    rows = [header]
    for task in summary.tasks:
        marker = "*" if task.task_id in summary.reduced_k else ""
        rows.append([task.task_id, *tally_cells(task, pass_k_cell(summary.k, task.pass_at_k, marker))])
    rows.append(["overall", *tally_cells(summary.overall, pass_k_cell(summary.k, summary.overall.pass_at_k))])
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append(f"statuses: {_statuses(summary.overall) or 'none'}")
    reduced = {task.task_id: task.k_used for task in summary.tasks if task.task_id in summary.reduced_k}
    if reduced:
        listed = ", ".join(f"{task_id} (n={n})" for task_id, n in reduced.items())
        lines.append(f"* pass@n over the n < {summary.k} scored attempts: {listed}")
    lines.append(f"threshold: reward >= {summary.threshold:g}; run wall time {summary.run_wall_s:.1f}s")
    if summary.broken:
        lines.append(f"broken inputs, not run ({len(summary.broken)}):")
        lines += [f"  {line}" for line in summary.broken]
    return "\n".join(lines)


def pass_k_cell(k: int, value: float | None, marker: str = "") -> str | None:
    """The pass@k cell, None at k = 1 (the pass@1 column says it)."""
    return None if k == 1 else number(value) + marker
