"""`opencode-env export --format trl|sequences|steps|atif RESULT.json...`: rollouts as JSONL rows for offline training.

trl: one row per rollout (its root agent's final sequence; a failed rollout keeps a masked row, see formats.py).
sequences: one row per training sequence of every session (forks and sub-agents give several), each with its
rollout index. steps: one row per completed agent or sub-agent turn (steps.py), every agent token of a usable
rollout. Calls not tied to OpenCode's session (kind "unattributed") are in no row; the summary on stderr counts
them, and a second line says how many of the rollouts' agent tokens the rows carry.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from pydantic import ValidationError

from opencode_env.training.atif import export_atif
from opencode_env.training.coverage import Coverage, ExportFormat, total_coverage
from opencode_env.training.formats import TrainingRow, training_rows
from opencode_env.training.sequences import sequences_coverage, trl_row_coverage, unattributed_turns
from opencode_env.training.steps import StepSample, steps_coverage, training_steps_batch
from opencode_env.wire.models import RolloutResult

RowFormat = Literal["trl", "sequences", "steps"]
ROW_FORMATS: tuple[RowFormat, ...] = ("trl", "sequences", "steps")
ROWS_NAMED: dict[ExportFormat, str] = {"trl_row": "trl rows", "sequences": "sequence rows", "steps": "step rows"}


def add_export_parser(commands: Any) -> None:
    """Register `export` on the CLI's subparsers."""
    export = commands.add_parser("export", help="write rollouts' training rows as JSONL (trl, sequences or steps)")
    export.add_argument("results", nargs="+", type=Path, metavar="RESULT.json", help="RolloutResult JSON files")
    export.add_argument("--format", choices=(*ROW_FORMATS, "atif"), default="trl", dest="row_format")
    export.add_argument("--output", "-o", type=Path, default=None, help="JSONL file (default: stdout)")
    export.add_argument("--filler-token-id", type=int, default=0, help="the one token of a failed rollout's row")
    export.set_defaults(handler=run_export)


def read_results(paths: list[Path]) -> list[RolloutResult]:
    results = []
    for path in paths:
        try:
            results.append(RolloutResult.model_validate_json(path.read_bytes()))
        except ValidationError as error:
            raise SystemExit(f"opencode-env export: {path} is not a RolloutResult: {error}") from error
        except OSError as error:
            raise SystemExit(f"opencode-env export: cannot read {path}: {error}") from error
    return results


def run_export(args: argparse.Namespace) -> int:
    """Rows of every result but oracle runs (the task's solution ran, no model: nothing to train on), which are left
    out and counted; the summary counts the rows' own usability and the agent tokens they carry."""
    everything = read_results(args.results)
    results = [result for result in everything if not result.oracle]
    if args.row_format == "atif":
        return export_atif(results, args.output)
    rows = export_rows(results, args.row_format, filler_token_id=args.filler_token_id)
    if args.output is None:
        _write(rows, sys.stdout)
    else:
        with args.output.open("w") as out:
            _write(rows, out)
    usable = sum(1 for row in rows if row.usable)
    not_completed = sum(1 for result in results if result.status != "completed")
    unattributed = sum(len(unattributed_turns(result)) for result in results)
    print(
        f"{len(rows)} rows ({usable} usable, {len(rows) - usable} not) from {len(results)} rollouts "
        f"({not_completed} not completed, {unattributed} unattributed calls); "
        f"{len(everything) - len(results)} oracle runs left out",
        file=sys.stderr,
    )
    print(coverage_line(export_coverage(results, args.row_format)), file=sys.stderr)
    return 0


def export_rows(
    results: list[RolloutResult], row_format: RowFormat, *, filler_token_id: int
) -> Sequence[TrainingRow | StepSample]:
    if row_format == "steps":
        return training_steps_batch(results)
    return training_rows(results, every_sequence=row_format == "sequences", filler_token_id=filler_token_id)


def export_coverage(results: list[RolloutResult], row_format: RowFormat) -> Coverage:
    """The sum over the results of the agent tokens the format's rows carry."""
    if row_format == "steps":
        return total_coverage("steps", (steps_coverage(result) for result in results))
    if row_format == "sequences":
        return total_coverage("sequences", (sequences_coverage(result) for result in results))
    return total_coverage("trl_row", (trl_row_coverage(result) for result in results))


def coverage_line(total: Coverage) -> str:
    """e.g. "coverage: 381 of 5,120 agent tokens (7.4%, 1 of 14 turns) in the trl rows; ..."."""
    return (
        f"coverage: {total.text()} in the {ROWS_NAMED[total.export]}; {total.auxiliary_tokens:,} auxiliary "
        f"and {total.unattributed_tokens:,} unattributed tokens are no agent tokens"
    )


def _write(rows: Sequence[TrainingRow | StepSample], out: TextIO) -> None:
    for row in rows:
        out.write(row.model_dump_json() + "\n")
