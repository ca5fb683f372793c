"""The audit of a dataset on any runner (wire/runner.py: in-process, a server, Ray): per task, the oracle and doing
nothing in both layouts (doing nothing in the native layout also surveys the box, read-only, for which plays apply),
then each applicable play in the native layout, then under our default grading. Plays of one task run on its one
request (its image built once, when it was loaded). Every result is written as it finishes."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opencode_env.audit import records
from opencode_env.audit.layouts import (
    LAYOUTS,
    Layout,
    Survey,
    TaskKind,
    in_layout,
    parse_survey,
    play_command,
    survey_commands,
)
from opencode_env.audit.plays import Play
from opencode_env.wire import RolloutRequest, RolloutResult, Runner, is_infrastructure_failure

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AuditTask:
    task_id: str
    kind: TaskKind
    request: RolloutRequest
    """The task as the agent gets it (no solution)."""
    oracle: RolloutRequest
    """The task with its reference solution (and, for a Harbor task, its solution/ files)."""


@dataclass
class Counter:
    done: int = 0
    planned: int = 0


def file_name(text: str) -> str:
    """A file name for a task id or a play's run: the id itself where it is one, else its readable part and a hash of
    the whole (so two ids never share a file, and none is `.`, `..` or hidden)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:120]
    if safe != text or safe.startswith(".") or not safe:
        safe = f"{safe.lstrip('.') or '_'}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return safe


class Audit:
    def __init__(
        self,
        runner: Runner,
        plays: Sequence[Play],
        out: Path,
        *,
        concurrency: int | None = None,
        every_layout: bool = False,
        progress: Progress | None = None,
    ) -> None:
        self.runner, self.plays, self.out = runner, list(plays), out
        self.gate = asyncio.Semaphore(concurrency or runner.capabilities.max_concurrency)
        self.every_layout = every_layout
        self.progress = progress or (lambda _: None)
        self.count = Counter()

    async def run(self, tasks: Sequence[AuditTask], broken: Sequence[str] = ()) -> records.AuditReport:
        started = time.monotonic()
        self.count.planned = 4 * len(tasks)
        audits = await asyncio.gather(*(self.task(task) for task in tasks))
        unfit = [
            f"{task.task_id}: its verify commands do not fit a request in the native layout: {audit}"
            for task, audit in zip(tasks, audits, strict=True)
            if isinstance(audit, ValueError)
        ]
        return records.AuditReport(
            where=self.runner.capabilities.where,
            plays=[records.play_info(play) for play in self.plays],
            tasks=[audit for audit in audits if isinstance(audit, records.TaskAudit)],
            broken=[*broken, *unfit],
            wall_s=round(time.monotonic() - started, 2),
            rollouts=self.count.done,
        )

    async def rollout(self, request: RolloutRequest, task_id: str, name: str) -> tuple[RolloutResult, str]:
        async with self.gate:
            result = await self.runner.run_rollout(request)
        relative = f"results/{file_name(task_id)}/{file_name(name)}.json"
        path = self.out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(path.write_text, result.model_dump_json(indent=1))
        self.count.done += 1
        self.progress(
            f"[{self.count.done}/{self.count.planned}] {task_id} {name}: {result.status}, reward {result.reward}"
        )
        return result, relative

    async def task(self, task: AuditTask) -> records.TaskAudit | ValueError:
        """The task's audit; the ValueError when the native layout cannot be expressed as a request (the task's
        verify commands at the length limit already, say)."""
        try:
            in_layout(task.oracle, "native")
        except ValueError as error:
            self.count.planned -= 4
            return error
        base = task.request.model_copy(update={"solution": None})
        oracle = task.oracle
        survey = base.model_copy(update={"solution": survey_commands(self.plays)})
        nothing = {"native": survey, "ours": base.model_copy(update={"solution": []})}
        runs = await asyncio.gather(
            *(self.rollout(in_layout(oracle, layout), task.task_id, f"oracle.{layout}") for layout in LAYOUTS),
            *(
                self.rollout(in_layout(nothing[layout], layout), task.task_id, f"do-nothing.{layout}")
                for layout in LAYOUTS
            ),
        )
        oracles = dict(zip(LAYOUTS, runs[:2], strict=True))
        nothings = dict(zip(LAYOUTS, runs[2:], strict=True))
        audit = records.TaskAudit(task_id=task.task_id, kind=task.kind)
        for layout in LAYOUTS:
            (oracle_result, oracle_file), (nothing_result, nothing_file) = oracles[layout], nothings[layout]
            audit.checks.append(records.check(layout, oracle_result, nothing_result, (oracle_file, nothing_file)))
        surveyed = nothings["native"][0]
        found = parse_survey("\n".join(run.stdout for run in surveyed.solution_results))
        self.count.planned += sum(1 for play in self.plays if play.name in found.applies)
        played = await asyncio.gather(
            *(self.play(task, base, play, found, {k: v[0] for k, v in nothings.items()}) for play in self.plays)
        )
        audit.records = [record for pair in played for record in pair]
        audit.suggestions = records.suggestions(audit, {play.name: play for play in self.plays})
        return audit

    async def play(
        self,
        task: AuditTask,
        base: RolloutRequest,
        play: Play,
        survey: Survey,
        nothing: dict[Layout, RolloutResult],
    ) -> list[records.Record]:
        if is_infrastructure_failure(nothing["native"].status):
            why = f"the survey (doing nothing, natively) failed on our side: {nothing['native'].error}"
            return [records.unplayed(task.task_id, play, layout, "error", why) for layout in LAYOUTS]
        if play.name not in survey.applies:
            surveyed = nothing["native"]
            why = (
                "the survey found nothing in the agent's box for this play to act on"
                if surveyed.solution_results
                else f"the survey never ran ({surveyed.status}: {surveyed.error})"
            )
            return [records.unplayed(task.task_id, play, layout, "not_applicable", why) for layout in LAYOUTS]
        request = base.model_copy(update={"solution": [play_command(play)]})
        result, relative = await self.rollout(
            in_layout(request, "native", survey.keeps.get(play.name, ())), task.task_id, f"{play.name}.native"
        )
        first = records.record(task.task_id, play, "native", result, nothing=nothing["native"], result_file=relative)
        if first.outcome == "not_applicable":
            return [first, records.unplayed(task.task_id, play, "ours", "not_applicable", first.why)]
        if first.outcome != "admitted" and not self.every_layout:
            why = "not admitted in the native layout, so not replayed (--every-layout plays it anyway)"
            return [first, records.unplayed(task.task_id, play, "ours", "not_played", why)]
        self.count.planned += 1
        result, relative = await self.rollout(in_layout(request, "ours"), task.task_id, f"{play.name}.ours")
        second = records.record(task.task_id, play, "ours", result, nothing=nothing["ours"], result_file=relative)
        return [first, second]
