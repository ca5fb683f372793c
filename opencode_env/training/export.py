"""Rollouts as rows for offline training (`opencode-env export --format trl|sequences|steps|atif`).

trl: one row per rollout (its root agent's final sequence; a failed rollout keeps a masked row, see formats.py).
sequences: one row per training sequence of every session (forks and sub-agents give several), each with its
rollout index. steps: one row per completed agent or sub-agent turn (steps.py), every agent token of a usable
rollout. Calls not tied to OpenCode's session (kind "unattributed") are in no row; the summary on stderr counts
them, and a second line says how many of the rollouts' agent tokens the rows carry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from opencode_env.training.coverage import Coverage, ExportFormat, total_coverage
from opencode_env.training.formats import TrainingRow, training_rows
from opencode_env.training.sequences import sequences_coverage, trl_row_coverage
from opencode_env.training.steps import StepSample, steps_coverage, training_steps_batch
from opencode_env.wire import RolloutResult

RowFormat = Literal["trl", "sequences", "steps"]
ROW_FORMATS: tuple[RowFormat, ...] = ("trl", "sequences", "steps")
ROWS_NAMED: dict[ExportFormat, str] = {"trl_row": "trl rows", "sequences": "sequence rows", "steps": "step rows"}


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


@dataclass(frozen=True)
class ExportOrigin:
    """Where a rollout's rows came from: the result file, and the attempt number in an eval (0 outside one)."""

    source: str = ""
    attempt: int = 0


TEXT_COLUMNS = ("problem", "session_id", "parent_session_id")
"""Columns None in some rows: written as "" so a column has one type in every file (JSON null would make it a
null-typed column in a file where no row sets it, and files would no longer concatenate)."""


def export_record(row: TrainingRow | StepSample, origin: ExportOrigin) -> dict[str, Any]:
    """The row as its JSONL object: every column one type whatever the row (reward 0.0 where there is none, and the
    row is then unusable), with its source and attempt."""
    record = row.model_dump(mode="json")
    for name in TEXT_COLUMNS:
        if name in record and record[name] is None:
            record[name] = ""
    if record["reward"] is None:
        record["reward"] = 0.0
    record["source"], record["attempt"] = origin.source, origin.attempt
    return record


def write_rows(rows: Sequence[TrainingRow | StepSample], out: TextIO, origins: Sequence[ExportOrigin] = ()) -> None:
    """Each row as a JSON line; `origins[i]` is where the rollout of rollout_index i came from."""
    for row in rows:
        origin = origins[row.rollout_index] if row.rollout_index < len(origins) else ExportOrigin()
        out.write(json.dumps(export_record(row, origin), separators=(",", ":")) + "\n")
