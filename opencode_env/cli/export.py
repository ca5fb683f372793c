"""`opencode-env export --format trl|sequences|steps|atif RESULT_OR_DIR...`: rollouts as JSONL for training."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opencode_env.cli.result_files import ResultFile, ResultFileError, read_result, result_files
from opencode_env.training.atif import export_atif
from opencode_env.training.export import (
    ROW_FORMATS,
    ExportOrigin,
    coverage_line,
    export_coverage,
    export_rows,
    write_rows,
)
from opencode_env.training.formats import TrainingRow
from opencode_env.training.sequences import TRL_ROW_WARNING_BELOW, trl_row_warning, unattributed_turns
from opencode_env.training.steps import StepSample
from opencode_env.wire import RolloutResult

EXPORT_DESCRIPTION = """Write rollouts' training rows as JSONL, one JSON object per line, for offline training
(`datasets.load_dataset("json", data_files=...)` reads it; every column has one type in every file, so files
concatenate: text columns are "" where there is nothing, reward is 0.0 where a rollout has none, and such rows
are usable=false).

  trl        one row per rollout: its root agent's final sequence (prompt_ids, completion_ids, logprobs, env_mask),
             what TRL's GRPO trainer takes; a failed rollout keeps a masked row so the group keeps its size.
  sequences  one row per training sequence of every session: a rollout whose context was compacted or rewritten
             (forks) or that ran sub-agents gives several rows, each with its session. For a rollout with one
             session and no fork it is the same row as trl (that sequence is the final one).
  steps      one row per completed agent or sub-agent model call (every agent token of a usable rollout), for
             per-step training.
  atif       one trajectory per rollout in Harbor's Agent Trajectory Interchange Format (ATIF-v1.8), with token
             ids and logprobs per step and sub-agents as embedded trajectories: for tools that read ATIF.

Each row names its `source` (the result file) and `attempt` (the attempt number in an eval, 0 otherwise). Oracle
runs (no model was called) are left out and counted; the summary on stderr counts rows, usability and the agent
tokens the rows carry. A trl row holding under 90% of its rollout's agent tokens (a session split by forks) counts
as not usable there, with its cause and the fix; --strict exits 1 when any row is not usable."""


def add_export_parser(commands: Any) -> None:
    """Register `export` on the CLI's subparsers."""
    export = commands.add_parser(
        "export",
        help="write rollouts' training rows as JSONL (trl, sequences, steps or atif; see export --help)",
        description=EXPORT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument(
        "results", nargs="+", type=Path, metavar="RESULT_OR_DIR", help="RolloutResult JSON files or eval output dirs"
    )
    export.add_argument("--format", choices=(*ROW_FORMATS, "atif"), default="trl", dest="row_format")
    export.add_argument("--output", "-o", type=Path, default=None, help="JSONL file (default: stdout)")
    export.add_argument("--filler-token-id", type=int, default=0, help="the one token of a failed rollout's row")
    export.add_argument("--strict", action="store_true", help="exit 1 when any row is not usable (default: 0)")
    export.set_defaults(handler=run_export)


def read_results(paths: list[Path]) -> list[tuple[ResultFile, RolloutResult]]:
    return [(found, read_result(found.path)) for path in paths for found in result_files(path)]


def run_export(args: argparse.Namespace) -> int:
    """Rows of every result but oracle runs (the task's solution ran, no model: nothing to train on), which are left
    out and counted; the summary counts the rows' own usability and the agent tokens they carry."""
    try:
        everything = read_results(args.results)
    except ResultFileError as error:
        print(f"opencode-env export: {error}", file=sys.stderr)
        return 2
    kept = [(found, result) for found, result in everything if not result.oracle]
    results = [result for _, result in kept]
    if args.row_format == "atif":
        return export_atif(results, args.output)
    rows = export_rows(results, args.row_format, filler_token_id=args.filler_token_id)
    origins = [ExportOrigin(source=str(found.path), attempt=found.attempt) for found, _ in kept]
    if args.output is None:
        write_rows(rows, sys.stdout, origins)
    else:
        with args.output.open("w") as out:
            write_rows(rows, out, origins)
    short = short_trl_rows(kept, rows) if args.row_format == "trl" else []
    usable = sum(1 for row in rows if row.usable) - len(short)
    not_completed = sum(1 for result in results if result.status != "completed")
    unattributed = sum(len(unattributed_turns(result)) for result in results)
    held = f"; {len(short)} of them hold under {TRL_ROW_WARNING_BELOW:.0%} of their agent tokens" if short else ""
    print(
        f"{len(rows)} rows ({usable} usable, {len(rows) - usable} not{held}) from {len(results)} rollouts "
        f"({not_completed} not completed, {unattributed} unattributed calls); "
        f"{len(everything) - len(results)} oracle runs left out",
        file=sys.stderr,
    )
    print(coverage_line(export_coverage(results, args.row_format)), file=sys.stderr)
    for source, why in short[:SHORT_ROWS_SHOWN]:
        print(f"short row:  {source}: {why}", file=sys.stderr)
    if len(short) > SHORT_ROWS_SHOWN:
        print(f"short row:  and {len(short) - SHORT_ROWS_SHOWN} more", file=sys.stderr)
    return 1 if args.strict and usable < len(rows) else 0


SHORT_ROWS_SHOWN = 5


def short_trl_rows(
    kept: list[tuple[ResultFile, RolloutResult]], rows: Sequence[TrainingRow | StepSample]
) -> list[tuple[str, str]]:
    """(source, cause and fix) of each usable TRL row (one per rollout) that holds under TRL_ROW_WARNING_BELOW of its
    rollout's agent tokens."""
    found = (
        (str(path.path), trl_row_warning(result)) for (path, result), row in zip(kept, rows, strict=True) if row.usable
    )
    return [(source, why) for source, why in found if why is not None]
