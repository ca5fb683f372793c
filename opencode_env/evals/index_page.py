"""DIR/index.html: an eval's summary table with a link to every attempt's page; one self-contained page (inline CSS
under the viewer's strict CSP, no script, no external asset)."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from urllib.parse import quote

from opencode_env.evals.summary import AttemptOutcome, EvalSummary, Tally, column_names, pass_k_cell, tally_cells
from opencode_env.viewer.page import html_document

Href = Callable[[str, int], str]
"""The page of (task id, attempt number), relative to the index."""

STYLE = """
:root { --fg: #1d2430; --muted: #667085; --line: #d9dee7; --bg: #f7f8fa; --ok: #1a7f37; --bad: #c4321c;
  --warn: #9a6700; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); }
main { max-width: 1400px; margin: 0 auto; padding: 16px 20px 60px; }
h1 { font-size: 20px; margin: 4px 0 8px; }
p.meta { color: var(--muted); margin: 0 0 12px; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); text-align: right; vertical-align: top; }
th { background: #eef1f5; font-weight: 600; }
td.name, th.name, td.statuses, td.attempts { text-align: left; }
td.name { font-family: ui-monospace, Menlo, Consolas, monospace; word-break: break-all; }
tfoot td { font-weight: 600; }
td.statuses { color: var(--muted); font-size: 12.5px; }
a.attempt { display: inline-block; min-width: 1.8em; margin: 1px; padding: 0 5px; border-radius: 8px;
  text-align: center; text-decoration: none; font-weight: 600; background: #eef1f5; color: var(--fg); }
a.attempt.success { background: #dafbe1; color: var(--ok); }
a.attempt.failure { background: #ffebe9; color: var(--bad); }
a.attempt.infra { background: #fff8c5; color: var(--warn); }
p.note { color: var(--muted); font-size: 12.5px; }
"""


def _statuses(tally: Tally) -> str:
    scored = ", ".join(f"{status} {count}" for status, count in sorted(tally.statuses.items()))
    infra = ", ".join(f"{status} {count}" for status, count in sorted(tally.infrastructure_failures.items()))
    text = escape(scored)
    if infra:
        text += f"<br>infrastructure: {escape(infra)}"
    return text


def _attempt_class(outcome: AttemptOutcome, threshold: float) -> str:
    if not outcome.scored:
        return "infra"
    return "success" if outcome.succeeded(threshold) else "failure"


def _attempt_link(task_id: str, outcome: AttemptOutcome, threshold: float, href: Href) -> str:
    title = f"attempt {outcome.attempt}: {outcome.status}, reward {outcome.reward}, {outcome.wall_s:.1f}s"
    target = escape(quote(href(task_id, outcome.attempt)))
    kind = _attempt_class(outcome, threshold)
    return f'<a class="attempt {kind}" href="{target}" title="{escape(title)}">{outcome.attempt}</a>'


def _cells(tally: Tally, pass_k: str | None) -> str:
    cells = "".join(f"<td>{escape(value)}</td>" for value in tally_cells(tally, pass_k))
    return cells + f'<td class="statuses">{_statuses(tally)}</td>'


def _task_rows(summary: EvalSummary, href: Href) -> str:
    rows = []
    for task in summary.tasks:
        marker = "*" if task.task_id in summary.reduced_k else ""
        links = " ".join(_attempt_link(task.task_id, outcome, summary.threshold, href) for outcome in task.outcomes)
        rows.append(
            f'<tr><td class="name">{escape(task.task_id)}</td>'
            f"{_cells(task, pass_k_cell(summary.k, task.pass_at_k, marker))}"
            f'<td class="attempts">{links}</td></tr>'
        )
    return "".join(rows)


def _header(k: int) -> str:
    cells = "".join(f"<th>{escape(name)}</th>" for name in column_names(k))
    return (
        f'<thead><tr><th class="name">task</th>{cells}<th class="name">statuses</th><th class="name">attempts</th>'
        "</tr></thead>"
    )


def _notes(summary: EvalSummary) -> str:
    notes = [
        f"An attempt succeeds when its reward is at least {summary.threshold:g}. Infrastructure failures are counted "
        "apart and never scored; overall pass@1 and pass@k are means over the tasks with a scored attempt."
    ]
    reduced = [f"{task.task_id} (n={task.k_used})" for task in summary.tasks if task.task_id in summary.reduced_k]
    if reduced:
        notes.append(f"* pass@n over the n &lt; {summary.k} scored attempts: {escape(', '.join(reduced))}")
    return "".join(f'<p class="note">{note}</p>' for note in notes)


def _broken(broken: list[str]) -> str:
    if not broken:
        return ""
    items = "".join(f'<li class="broken">{escape(line)}</li>' for line in broken)
    return f'<h2>Broken inputs, not run ({len(broken)})</h2><ul class="broken">{items}</ul>'


def render_index(summary: EvalSummary, href: Href) -> str:
    """The eval's index page; every attempt with a result links to its viewer page."""
    meta = (
        f"k={summary.k}, model {summary.model or '-'}, {len(summary.tasks)} tasks, "
        f"{summary.overall.attempts} attempts; this run took {summary.run_wall_s:.1f}s"
    )
    overall = _cells(summary.overall, pass_k_cell(summary.k, summary.overall.pass_at_k))
    footer = f'<tfoot><tr><td class="name">overall</td>{overall}<td></td></tr></tfoot>'
    table = f"<table>{_header(summary.k)}<tbody>{_task_rows(summary, href)}</tbody>{footer}</table>"
    body = (
        f'<main><h1>opencode-env eval</h1><p class="meta">{escape(meta)}</p>{table}{_notes(summary)}'
        f"{_broken(summary.broken)}</main>"
    )
    return html_document("opencode-env eval", body, scripts=[], styles=[STYLE])
