"""`opencode-env audit TASK_DIR_OR_FILE... --out DIR`: which reward hacks each task admits, played against its own
grader in its native layout and under our default grading."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from opencode_env.audit.driver import Audit, AuditTask
from opencode_env.audit.inputs import load_audit_inputs
from opencode_env.audit.page import render_page
from opencode_env.audit.plays import PlayError, panel
from opencode_env.audit.records import AuditReport
from opencode_env.audit.table import render_table
from opencode_env.cli.endings import Ending, run_until_signalled, say
from opencode_env.cli.eval import open_runner
from opencode_env.cli.support import image_progress_to_stderr
from opencode_env.evals.runner import EvalError
from opencode_env.sandbox import backend_names

AUDIT_DESCRIPTION = """Play a panel of known reward hacks against every task's own grader, each a deterministic script
run as the agent (no model), and say which each task admits: in its native layout (one box, the grader as root, as
Harbor runs it) and under our default grading (the grader's box). A hack is admitted when it raises the reward above
doing nothing's. Per task: the oracle must reach its maximum and doing nothing must not (as check-task says), both in
each layout. Writes into DIR:
  audit.json                one record per task x play x layout with its evidence
  results/<task>/*.json     every rollout's RolloutResult
  index.html                the matrix, worst tasks first, each cell linking to its evidence
Exit status: 0 when no task admits a hack under our default grading, 1 when one does (or a task was broken, or a
run failed on our side), 2 for a problem with the arguments or the plays, 128 + the signal's number on a signal."""


async def _audit(args: argparse.Namespace, tasks: list[AuditTask], broken: list[str]) -> AuditReport:
    plays = panel(args.plays, args.play)
    runner = await open_runner(args)
    try:
        audit = Audit(
            runner, plays, args.out, concurrency=args.concurrency, every_layout=args.every_layout, progress=say
        )
        return await audit.run(tasks, broken)
    finally:
        await runner.close()


def write_report(out: Path, report: AuditReport) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(report.model_dump_json(indent=1))
    (out / "index.html").write_text(render_page(report))


def _cmd_audit(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.server, args.backend, args.ray))) > 1:
        print("opencode-env audit: --server, --backend and --ray exclude each other", file=sys.stderr)
        return 2
    try:
        panel(args.plays, args.play)
        loaded = load_audit_inputs(args.inputs, report=say, image_progress=image_progress_to_stderr)
    except (EvalError, PlayError) as error:
        print(f"opencode-env audit: {error}", file=sys.stderr)
        return 2
    for line in loaded.broken:
        say(f"opencode-env audit: broken task skipped: {line}")
    if not loaded.tasks:
        print(f"opencode-env audit: no task to audit ({len(loaded.broken)} broken)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    ending = Ending()
    try:
        report = run_until_signalled(_audit(args, loaded.tasks, loaded.broken), ending)
    except EvalError as error:
        print(f"opencode-env audit: {error}", file=sys.stderr)
        return 2
    if report is None:
        say(f"opencode-env audit: {ending.describe()}; the results finished so far are in {args.out / 'results'}")
        return ending.exit_code
    write_report(args.out, report)
    print(render_table(report))
    if args.fix_suggestions:
        for task in report.worst_first():
            for line in task.suggestions:
                print(f"fix {task.task_id}: {line}")
    print(f"index:      {args.out / 'index.html'}")
    errors = any(record.outcome == "error" for task in report.tasks for record in task.records)
    return 1 if report.admitted_by_us() or report.broken or errors else 0


def add_audit_parser(subparsers: Any) -> None:
    """Register `audit` on the CLI's subparsers (argparse's private _SubParsersAction, hence Any)."""
    parser = subparsers.add_parser(
        "audit",
        help="play known reward hacks against each task's own grader: which it admits, natively and under ours",
        description=AUDIT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inputs", nargs="+", type=Path, metavar="TASK_DIR_OR_FILE")
    parser.add_argument("--out", type=Path, default=Path("audit"), metavar="DIR", help="where the report goes (audit)")
    parser.add_argument(
        "--plays", type=Path, action="append", default=[], metavar="DIR", help="a folder of plays of your own (*.sh)"
    )
    parser.add_argument(
        "--play", action="append", default=[], metavar="NAME", help="run only this play (repeatable; default: all)"
    )
    parser.add_argument(
        "--every-layout",
        action="store_true",
        help="play under our default grading even what the native layout did not admit",
    )
    parser.add_argument(
        "--fix-suggestions", action="store_true", help="print the change to each task that closes a hole"
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, metavar="N", help="rollouts at once (default: the runner's)"
    )
    parser.add_argument("--server", default=None, metavar="URL", help="run on this opencode-env server")
    parser.add_argument("--backend", choices=backend_names(), default=None, help="in-process backend")
    parser.add_argument("--ray", default=None, metavar="ADDRESS", help="run on this Ray cluster ('auto': this node's)")
    parser.set_defaults(handler=_cmd_audit)
