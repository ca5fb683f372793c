"""`opencode-env export --format trl|sequences|steps RESULT.json...`: rollouts as JSONL rows for offline training."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_env.training.export import (
    ROW_FORMATS,
    coverage_line,
    export_coverage,
    export_rows,
    write_rows,
)
from opencode_env.training.sequences import unattributed_turns
from opencode_env.wire.models import RolloutResult


def add_export_parser(commands: Any) -> None:
    """Register `export` on the CLI's subparsers."""
    export = commands.add_parser("export", help="write rollouts' training rows as JSONL (trl, sequences or steps)")
    export.add_argument("results", nargs="+", type=Path, metavar="RESULT.json", help="RolloutResult JSON files")
    export.add_argument("--format", choices=ROW_FORMATS, default="trl", dest="row_format")
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
    rows = export_rows(results, args.row_format, filler_token_id=args.filler_token_id)
    if args.output is None:
        write_rows(rows, sys.stdout)
    else:
        with args.output.open("w") as out:
            write_rows(rows, out)
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
