"""What an audit found, as data (audit.json): one record per task x play x layout with its evidence, each task's
oracle and do-nothing checks per layout, and the pure rules that turn rollouts into outcomes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from opencode_env.audit.layouts import Layout, TaskKind, found_nothing, play_exit
from opencode_env.audit.plays import Play
from opencode_env.rollout.check_task import Verdict, judge
from opencode_env.wire import RolloutResult, is_infrastructure_failure
from opencode_env.wire.grading import IntegrityFinding

Outcome = Literal["admitted", "blocked", "not_applicable", "not_played", "error"]
PART_CHARS = 2_000


class Check(BaseModel):
    """The task's oracle and do-nothing runs in one layout, judged as check-task judges them."""

    layout: Layout
    verdict: Verdict
    reason: str
    oracle_reward: float | None
    nothing_reward: float | None
    oracle_file: str
    nothing_file: str


class Record(BaseModel):
    task_id: str
    play: str
    family: str
    layout: Layout
    outcome: Outcome
    why: str = Field(description="The outcome in words: the rewards compared, or why the play was not run.")
    reward: float | None = None
    baseline: float | None = Field(None, description="Doing nothing's reward in the same layout.")
    status: str = ""
    error: str | None = None
    findings: list[IntegrityFinding] = Field(default_factory=list)
    log: str = Field("", description="The play's own output (the tail), then verify's.")
    result_file: str = Field("", description="The whole RolloutResult, relative to the audit's folder.")


class TaskAudit(BaseModel):
    task_id: str
    kind: TaskKind
    checks: list[Check] = Field(default_factory=list)
    records: list[Record] = Field(default_factory=list)
    suggestions: list[str] = Field(default_factory=list)

    def admitted(self, layout: Layout) -> list[str]:
        return [record.play for record in self.records if record.layout == layout and record.outcome == "admitted"]


class PlayInfo(BaseModel):
    name: str
    family: str
    tries: str
    proves: str
    fix: str
    source: str


class AuditReport(BaseModel):
    where: str
    plays: list[PlayInfo]
    tasks: list[TaskAudit]
    broken: list[str] = Field(default_factory=list)
    wall_s: float = 0.0
    rollouts: int = 0

    def worst_first(self) -> list[TaskAudit]:
        return sorted(
            self.tasks, key=lambda task: (-len(task.admitted("ours")), -len(task.admitted("native")), task.task_id)
        )

    def admitted_by_us(self) -> list[TaskAudit]:
        return [task for task in self.tasks if task.admitted("ours")]


def play_info(play: Play) -> PlayInfo:
    return PlayInfo(**play.model_dump(include={"name", "family", "tries", "proves", "fix", "source"}))


def check(layout: Layout, oracle: RolloutResult, nothing: RolloutResult, files: tuple[str, str]) -> Check:
    verdict, reason = judge(oracle, nothing)
    return Check(
        layout=layout,
        verdict=verdict,
        reason=reason,
        oracle_reward=oracle.reward,
        nothing_reward=nothing.reward,
        oracle_file=files[0],
        nothing_file=files[1],
    )


def evidence_log(result: RolloutResult) -> str:
    """The play's output, then each verify command's, each body its last PART_CHARS (the play's exit line is last)."""
    parts = [("$ play: stderr", run.stderr) for run in result.solution_results]
    parts += [("$ play", run.stdout) for run in result.solution_results]
    parts += [
        (f"$ verify: {run.cmd[-300:]}\n(exit {run.exit_code})", run.stdout + run.stderr)
        for run in result.verify_results
    ]
    return "\n".join(
        f"{head}\n{body if len(body) <= PART_CHARS else '...' + body[-PART_CHARS:]}" for head, body in parts
    )


def outcome_of(result: RolloutResult, nothing: RolloutResult) -> tuple[Outcome, str]:
    """Admitted when the play raised the reward above doing nothing's in the same layout; blocked otherwise; error when
    either run failed on our side or the play never reached its end (killed, out of time: it proves nothing)."""
    if is_infrastructure_failure(nothing.status):
        return "error", f"the do-nothing run failed on our side ({nothing.status}): no baseline"
    if is_infrastructure_failure(result.status):
        return "error", f"the play's run failed on our side ({result.status}): {result.error}"
    played = result.solution_results[0].stdout if result.solution_results else ""
    if play_exit(played) is None:
        return "error", f"the play did not finish, so its run says nothing ({result.status}: {result.error})"
    if found_nothing(played):
        return "not_applicable", "the play found nothing to act on in the agent's box"
    baseline = nothing.reward if nothing.reward is not None else 0.0
    reward = result.reward if result.reward is not None else 0.0
    if reward > baseline:
        return "admitted", f"reward {result.reward} against {nothing.reward} for doing nothing"
    why = f"reward {result.reward}, no more than doing nothing's {nothing.reward}"
    kinds = sorted({finding.kind for finding in result.integrity})
    if kinds:
        why += f"; our grader recorded {', '.join(kinds)}"
    if result.error:
        why += f"; {result.error[:300]}"
    return "blocked", why


def record(
    task_id: str, play: Play, layout: Layout, result: RolloutResult, *, nothing: RolloutResult, result_file: str
) -> Record:
    outcome, why = outcome_of(result, nothing)
    return Record(
        task_id=task_id,
        play=play.name,
        family=play.family,
        layout=layout,
        outcome=outcome,
        why=why,
        reward=result.reward,
        baseline=nothing.reward,
        status=result.status,
        error=result.error,
        findings=result.integrity,
        log=evidence_log(result),
        result_file=result_file,
    )


def unplayed(task_id: str, play: Play, layout: Layout, outcome: Outcome, why: str) -> Record:
    return Record(task_id=task_id, play=play.name, family=play.family, layout=layout, outcome=outcome, why=why)


def suggestions(task: TaskAudit, plays: dict[str, Play]) -> list[str]:
    """Changes to the task that close its holes: each admitted play's fix, and the grader's box where our default
    blocks what the native layout admits."""
    lines = []
    for name in dict.fromkeys([*task.admitted("native"), *task.admitted("ours")]):
        lines.append(f"{name}: {plays[name].fix}")
    blocked_by_us = [
        record.play
        for record in task.records
        if record.layout == "ours" and record.outcome == "blocked" and record.play in task.admitted("native")
    ]
    if blocked_by_us and task.kind == "harbor":
        lines.append(
            'declare the grader\'s box ([verifier] sandbox = "fresh" in task.toml): it blocks '
            + ", ".join(blocked_by_us)
        )
    return lines
