"""DIR/index.html: the audit's matrix, worst tasks first, each cell linking to its evidence (the play's whole
RolloutResult); one self-contained page in the eval index's style (inline CSS under the viewer's CSP, no script)."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from opencode_env.audit.records import AuditReport, Record, TaskAudit
from opencode_env.audit.table import played_columns
from opencode_env.evals.index_page import STYLE as EVAL_STYLE
from opencode_env.viewer.page import html_document

STYLE = (
    EVAL_STYLE
    + """
a.cell { display: inline-block; min-width: 1.4em; margin: 1px; padding: 0 4px; border-radius: 6px;
  text-align: center; text-decoration: none; font-weight: 600; background: #eef1f5; color: var(--fg); }
a.cell.admitted { background: #ffebe9; color: var(--bad); }
a.cell.blocked { background: #dafbe1; color: var(--ok); }
a.cell.error { background: #fff8c5; color: var(--warn); }
span.cell { color: var(--muted); }
th.play { writing-mode: vertical-rl; text-align: left; font-weight: 500; }
ul.fix { margin: 4px 0 0; padding-left: 18px; text-align: left; color: var(--muted); font-size: 12.5px; }
"""
)
LETTERS = {"admitted": "A", "blocked": "B", "error": "E", "not_applicable": "-", "not_played": "·"}


def _cell(record: Record | None, layout: str) -> str:
    if record is None:
        return '<span class="cell">?</span>'
    title = escape(f"{layout}: {record.outcome}: {record.why}")
    letter = LETTERS[record.outcome]
    if not record.result_file:
        return f'<span class="cell" title="{title}">{letter}</span>'
    href = escape(quote(record.result_file))
    return f'<a class="cell {record.outcome}" href="{href}" title="{title}">{letter}</a>'


def _row(task: TaskAudit, columns: list[str]) -> str:
    checks = " ".join(
        f'<a href="{escape(quote(check.oracle_file))}" title="{escape(check.reason)}">{escape(check.layout)}: '
        f"{escape(check.verdict)}</a>"
        for check in task.checks
    )
    cells = []
    for play in columns:
        found = {record.layout: record for record in task.records if record.play == play}
        cells.append(f"<td>{_cell(found.get('native'), 'native')}{_cell(found.get('ours'), 'ours')}</td>")
    fixes = "".join(f"<li>{escape(line)}</li>" for line in task.suggestions)
    fix_list = f'<ul class="fix">{fixes}</ul>' if fixes else ""
    return (
        f'<tr><td class="name">{escape(task.task_id)}{fix_list}</td><td class="statuses">{escape(task.kind)}</td>'
        f'<td class="statuses">{checks}</td>{"".join(cells)}</tr>'
    )


def render_page(report: AuditReport) -> str:
    columns = played_columns(report)
    by_name = {play.name: play for play in report.plays}
    heads = "".join(f'<th class="play" title="{escape(by_name[name].tries)}">{escape(name)}</th>' for name in columns)
    rows = "".join(_row(task, columns) for task in report.worst_first())
    table = (
        f'<table><thead><tr><th class="name">task</th><th class="name">kind</th><th class="name">oracle</th>{heads}'
        f"</tr></thead><tbody>{rows}</tbody></table>"
    )
    native = sum(1 for task in report.tasks if task.admitted("native"))
    meta = (
        f"{len(report.tasks)} tasks, {len(report.plays)} plays, {report.rollouts} rollouts in {report.wall_s:.0f}s on "
        f"{report.where}; {native} tasks admit a hack natively, {len(report.admitted_by_us())} under our default"
    )
    plays = "".join(
        f'<tr><td class="name">{escape(play.name)}</td><td class="statuses">{escape(play.family)}</td>'
        f'<td class="statuses">{escape(play.tries)}</td><td class="statuses">{escape(play.proves)}</td></tr>'
        for play in report.plays
    )
    notes = (
        '<p class="note">Each cell: the native layout (the task\'s own harness: one box, a root grader), then ours '
        "(the grader's box). A: the play raised the reward above doing nothing's; B: it did not; -: nothing to act on; "
        "·: not replayed under ours (not admitted natively); E: no verdict (a run failed on our side, or the play did "
        "not finish). Each links to the play's RolloutResult.</p>"
    )
    broken = "".join(f"<li>{escape(line)}</li>" for line in report.broken)
    body = (
        f'<main><h1>opencode-env audit</h1><p class="meta">{escape(meta)}</p>{table}{notes}'
        f"<h2>The panel</h2><table><tbody>{plays}</tbody></table>"
        + (f"<h2>Broken inputs, not audited</h2><ul>{broken}</ul>" if broken else "")
        + "</main>"
    )
    return html_document("opencode-env audit", body, scripts=[], styles=[STYLE])
