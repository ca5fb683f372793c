"""The capture proxy's trace file read back: the turns and tool schemas a rollout's proxy wrote, one JSON line each.
Pure (no I/O): the pipeline reads the file from its proxy, the test doubles from a proxy process of their own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from opencode_env.wire.turn import BudgetRecord, DeliveryRecord, RefusedRecord, RolloutTurn, ToolsRecord, TurnRecord

TraceLine = ToolsRecord | TurnRecord | DeliveryRecord | RefusedRecord | BudgetRecord
_TRACE_LINE: TypeAdapter[TraceLine] = TypeAdapter(Annotated[TraceLine, Field(discriminator="type")])


@dataclass
class Trace:
    turns: list[RolloutTurn] = field(default_factory=list)
    tools: dict[str, list[Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    refused: int = 0
    """Calls the proxy refused before they reached the model (never turns)."""
    budget: BudgetRecord | None = None
    """Set when the trace reached its size bound: how many later calls were relayed but not recorded."""


def parse_trace(text: str) -> Trace:
    """Turns and tool schemas from the proxy's JSONL trace, with compacted prompt ids expanded.

    Strict: a line with an unknown key, type or outcome is left out and named in `problems`.
    """
    trace = Trace()
    sequences: dict[int, list[int]] = {}
    undelivered: dict[int, DeliveryRecord] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = _TRACE_LINE.validate_json(line)
            if isinstance(record, ToolsRecord):
                trace.tools[record.sha256] = record.tools
                continue
            if isinstance(record, DeliveryRecord):
                undelivered[record.turn] = record
                continue
            if isinstance(record, RefusedRecord):
                trace.refused = max(trace.refused, record.count)
                continue
            if isinstance(record, BudgetRecord):
                if trace.budget is None or record.dropped > trace.budget.dropped:
                    trace.budget = record
                continue
            prompt = record.prompt_token_ids
            if record.prompt_base is not None:
                base = record.prompt_base
                if base.count > len(sequences[base.turn]):
                    raise ValueError(f"prompt_base.count {base.count} is over turn {base.turn}'s ids")
                prompt = sequences[base.turn][: base.count] + prompt
            turn = RolloutTurn.model_validate(record.turn_fields(prompt))
            sequences[turn.turn] = turn.prompt_token_ids + turn.completion_token_ids
            trace.turns.append(turn)
        except KeyError as error:
            trace.problems.append(f"trace line {number}: prompt_base.turn {error} is not an earlier turn")
        except (ValueError, ValidationError) as error:
            trace.problems.append(f"trace line {number}: {error}")
    trace.turns.sort(key=lambda turn: turn.turn)
    for turn in trace.turns:
        if turn.turn in undelivered and turn.outcome == "complete":
            turn.outcome, turn.upstream_error = "undelivered", undelivered[turn.turn].detail
    return trace
