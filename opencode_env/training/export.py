"""`opencode-env export --format trl|sequences RESULT.json...`: rollouts as JSONL rows for offline training.

trl: one row per rollout (its final sequence; a failed rollout keeps a masked row, see formats.py).
sequences: one row per training sequence (a rollout with forks gives several), each with its rollout index.
Calls not tied to OpenCode's session (kind "unattributed") are in no row; the summary on stderr counts them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from opencode_env.training.formats import training_rows
from opencode_env.training.sequences import unattributed_turns
from opencode_env.wire.models import RolloutResult


def add_export_parser(commands: Any) -> None:
    """Register `export` on the CLI's subparsers."""
    export = commands.add_parser("export", help="write rollouts' training rows as JSONL (trl or sequences)")
    export.add_argument("results", nargs="+", type=Path, metavar="RESULT.json", help="RolloutResult JSON files")
    export.add_argument("--format", choices=["trl", "sequences"], default="trl", dest="row_format")
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


def write_rows(results: list[RolloutResult], row_format: str, out: TextIO, filler_token_id: int = 0) -> int:
    rows = training_rows(results, every_sequence=row_format == "sequences", filler_token_id=filler_token_id)
    for row in rows:
        out.write(row.model_dump_json() + "\n")
    return len(rows)


def run_export(args: argparse.Namespace) -> int:
    results = read_results(args.results)
    if args.output is None:
        count = write_rows(results, args.row_format, sys.stdout, args.filler_token_id)
    else:
        with args.output.open("w") as out:
            count = write_rows(results, args.row_format, out, args.filler_token_id)
    unusable = sum(1 for result in results if result.status != "completed")
    unattributed = sum(len(unattributed_turns(result)) for result in results)
    summary = f"{count} rows from {len(results)} rollouts ({unusable} not completed, {unattributed} unattributed calls)"
    print(summary, file=sys.stderr)
    return 0
