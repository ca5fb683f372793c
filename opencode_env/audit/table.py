"""The audit's matrix in the terminal: a row per task (worst first), a column per play that applies anywhere, each
cell the native outcome then ours."""

from __future__ import annotations

from opencode_env.audit.records import AuditReport, Outcome, Record, TaskAudit

MARKS: dict[Outcome, str] = {
    "admitted": "A",
    "blocked": ".",
    "not_applicable": "-",
    "not_played": " ",
    "error": "E",
}
LEGEND = (
    "cells: native/ours; A admitted (reward above doing nothing), . blocked, - not applicable, "
    "' ' not replayed (not admitted natively), E no verdict (a run failed on our side, or the play did not finish)"
)


def cell(task: TaskAudit, play: str) -> str:
    by_layout: dict[str, Record] = {record.layout: record for record in task.records if record.play == play}
    marks = [MARKS[by_layout[layout].outcome] if layout in by_layout else "?" for layout in ("native", "ours")]
    return "/".join(marks)


def played_columns(report: AuditReport) -> list[str]:
    return [
        play.name
        for play in report.plays
        if any(r.play == play.name and r.outcome != "not_applicable" for task in report.tasks for r in task.records)
    ]


def render_table(report: AuditReport) -> str:
    columns = played_columns(report)
    tasks = report.worst_first()
    width = max([len("task"), *(len(task.task_id) for task in tasks)])
    header = " ".join([f"{'task':<{width}}", "oracle", *(f"{index:>3}" for index in range(1, len(columns) + 1))])
    lines = [header]
    for task in tasks:
        verdicts = {check.layout: check.verdict[0] for check in task.checks}
        oracle = f"{verdicts.get('native', '?')}/{verdicts.get('ours', '?')}"
        lines.append(" ".join([f"{task.task_id:<{width}}", f"{oracle:<6}", *(f"{cell(task, c):>3}" for c in columns)]))
    lines.append("plays: " + ", ".join(f"{index} {name}" for index, name in enumerate(columns, start=1)))
    lines.append(LEGEND + "; oracle: o ok, b broken, i inconclusive (native/ours)")
    native = sum(1 for task in report.tasks if task.admitted("native"))
    ours = len(report.admitted_by_us())
    lines.append(
        f"{len(report.tasks)} tasks, {report.rollouts} rollouts in {report.wall_s:.0f}s on {report.where}: "
        f"{native} admit a hack natively, {ours} under our default grading"
    )
    return "\n".join(lines)
