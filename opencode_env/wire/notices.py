"""A result's warnings, typed: what each says, how serious it is and the fix, most serious first.

`RolloutResult.warnings` keeps the messages (what readers of older results and the answer read);
`RolloutResult.notices` holds the same warnings with their code, severity and fix. Severity:
  error    the data must not be trained on as it is (no ids, non-finite logprobs, a record contradicted)
  warning  trainable but degraded, with a fix (a TRL row short of the agent's tokens, sampling unrecorded)
  note     worth knowing, nothing to fix for training (a project config removed, a probe's aside)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Severity = Literal["error", "warning", "note"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "note")
UNCLASSIFIED = "unclassified"


class Notice(BaseModel):
    code: str = Field(description="Which warning this is (stable: filter on it), e.g. trl_row_short.")
    severity: Severity = Field(description="error: do not train on it as it is; warning: degraded; note: an aside.")
    message: str = Field(description="What happened, as RolloutResult.warnings has it.")
    fix: str = Field("", description="What to change so it does not happen again; empty when nothing is to fix.")


def ordered(notices: list[Notice]) -> list[Notice]:
    """Most serious first; in the order they were found within a severity."""
    return sorted(notices, key=lambda notice: SEVERITIES.index(notice.severity))


def reconciled(notices: list[Notice], messages: list[str]) -> list[Notice]:
    """`notices`, with a warning-severity notice for each message that has none (a result written before notices
    existed, or a message added without one), most serious first."""
    known = {notice.message for notice in notices}
    bare = [Notice(code=UNCLASSIFIED, severity="warning", message=text) for text in messages if text not in known]
    return ordered([*notices, *bare])


def notice_lines(notices: list[Notice]) -> list[str]:
    """A summary's lines: severity, message, and the fix where the message does not already carry it."""
    lines = []
    for notice in ordered(notices):
        fix = f" (fix: {notice.fix})" if notice.fix and notice.fix not in notice.message else ""
        lines.append(f"{notice.severity + ':':<12}{notice.message}{fix}")
    return lines
