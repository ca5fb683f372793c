"""Agent tokens: which calls generate them, in which session, whether their ids can be trained, and how many of
them an export carries.

Pure. A rollout's agent tokens are the completion tokens of its completed `agent` and `sub_agent` turns (OpenCode's
own calls, the root session's and its sub-agents'). Auxiliary calls (titles, summaries, compaction) and
unattributed calls are no agent tokens: they are counted apart, never trained. An export carries a turn wholly or
not at all, and only as trainable tokens (a row marked unusable carries none), so `covered_tokens` is the sum of
the carried turns' agent tokens and `left_out` names every other turn with why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from opencode_env.wire import RolloutResult, RolloutTurn, is_infrastructure_failure

ExportFormat = Literal["trl_row", "sequences", "steps"]
SessionKind = Literal["agent", "sub_agent"]
SessionKey = tuple[SessionKind, str | None, int]
"""(kind, session id, task step): ("agent", None, step) for the root agent's session of each step of the task (every
attributed agent call of a step is that step's one OpenCode session; a task without steps has step 0 only);
("sub_agent", session_id, step) for each sub-agent session."""

FORMAT_NAMES: dict[ExportFormat, str] = {"trl_row": "trl row", "sequences": "sequences", "steps": "steps"}


def is_trainable_turn(turn: RolloutTurn) -> bool:
    """A completed call of OpenCode's own agent or of one of its sub-agents: the turns that hold agent tokens
    (auxiliary and unattributed calls never are)."""
    return turn.kind in ("agent", "sub_agent") and turn.outcome == "complete"


def is_root_agent_turn(turn: RolloutTurn) -> bool:
    return turn.kind == "agent" and turn.outcome == "complete"


def session_key(result: RolloutResult, position: int) -> SessionKey:
    """The session of proxy_turns[position]. Each step of a multi-step task runs a new OpenCode session, so no
    sequence and no session's count of calls crosses a step, whatever the ids."""
    turn = result.proxy_turns[position]
    step = next((index for index, part in enumerate(result.steps) if part.first_turn <= position < part.end_turn), 0)
    return ("agent", None, step) if turn.kind == "agent" else ("sub_agent", turn.session_id, step)


def trainable_sessions(result: RolloutResult) -> dict[SessionKey, list[RolloutTurn]]:
    """The trainable turns by session, sessions in the order of their first turn, turns in the rollout's order."""
    sessions: dict[SessionKey, list[RolloutTurn]] = {}
    for position, turn in enumerate(result.proxy_turns):
        if is_trainable_turn(turn):
            sessions.setdefault(session_key(result, position), []).append(turn)
    return sessions


def ids_problem(turn: RolloutTurn) -> str | None:
    """Why a turn's engine ids cannot be trained on, or None."""
    if not turn.prompt_token_ids:
        return "no engine prompt ids"
    if not turn.completion_token_ids:
        return "no engine completion ids"
    if len(turn.completion_token_ids) != len(turn.per_token_logps):
        return f"{len(turn.completion_token_ids)} ids but {len(turn.per_token_logps)} logprobs"
    if not turn.aligned:
        return "ids, logprobs and the engine's completion token count disagree"
    return None


def rollout_failure(result: RolloutResult) -> str | None:
    """Why none of the rollout's data can be trained on (our side failed), or None."""
    if not is_infrastructure_failure(result.status):
        return None
    return f"the rollout failed on our side ({result.status}: {result.error or ''})"[:500]


def generated_tokens(turn: RolloutTurn) -> int:
    """How many tokens the call generated: its engine ids, else the upstream's usage, else its token texts."""
    if turn.completion_token_ids:
        return len(turn.completion_token_ids)
    return turn.usage.completion_tokens or len(turn.completion_tokens)


def agent_tokens_carried(result: RolloutResult, carried: Iterable[int]) -> tuple[int, int]:
    """(the agent tokens of the turns numbered `carried`, all the rollout's agent tokens)."""
    turns = set(carried)
    counts = [(turn.turn in turns, generated_tokens(turn)) for turn in result.proxy_turns if is_trainable_turn(turn)]
    return sum(tokens for inside, tokens in counts if inside), sum(tokens for _, tokens in counts)


class Coverage(BaseModel):
    """How many of a rollout's (or, summed, a batch's) agent tokens one export carries as trainable tokens."""

    export: ExportFormat
    rollouts: int = 1
    agent_tokens: int = Field(0, description="Completion tokens of the completed agent and sub-agent turns.")
    covered_tokens: int = Field(0, description="Of those, the ones the export carries as trainable tokens.")
    turns: int = Field(0, description="Completed agent and sub-agent turns.")
    covered_turns: int = 0
    left_out: dict[int, str] = Field(
        default_factory=dict, description="Turn -> why the export does not carry it (one rollout's; empty in a sum)."
    )
    auxiliary_tokens: int = Field(0, description="Generated by auxiliary calls (titles, summaries): not agent tokens.")
    unattributed_tokens: int = Field(0, description="Generated by calls not tied to OpenCode: not agent tokens.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fraction(self) -> float | None:
        """covered_tokens / agent_tokens; None when the rollout generated no agent token."""
        return self.covered_tokens / self.agent_tokens if self.agent_tokens else None

    def text(self) -> str:
        """e.g. "381 of 5,120 agent tokens (7.4%, 1 of 14 turns)"."""
        if self.fraction is None:
            return f"no agent tokens ({self.turns} turns)"
        return (
            f"{self.covered_tokens:,} of {self.agent_tokens:,} agent tokens "
            f"({percent(self.covered_tokens, self.agent_tokens)}, {self.covered_turns} of {self.turns} turns)"
        )


def percent(part: int, whole: int) -> str:
    """One decimal, rounded down: a part short of the whole never reads as 100%."""
    tenths = part * 1000 // whole
    return f"{tenths // 10}.{tenths % 10}%"


def coverage(
    result: RolloutResult, export: ExportFormat, carried: Iterable[int], reasons: Mapping[int, str]
) -> Coverage:
    """The coverage of an export that carries the turns numbered `carried`; every other trainable turn is left out
    with `reasons[turn]` (or a generic reason)."""
    carried_turns = set(carried)
    out = Coverage(export=export)
    for turn in result.proxy_turns:
        if turn.outcome != "complete":
            continue
        tokens = generated_tokens(turn)
        if turn.kind == "auxiliary":
            out.auxiliary_tokens += tokens
        elif turn.kind == "unattributed":
            out.unattributed_tokens += tokens
        elif is_trainable_turn(turn):
            out.agent_tokens += tokens
            out.turns += 1
            if turn.turn in carried_turns:
                out.covered_tokens += tokens
                out.covered_turns += 1
            else:
                out.left_out[turn.turn] = reasons.get(turn.turn, f"not in the {FORMAT_NAMES[export]} export")
    return out


def total_coverage(export: ExportFormat, parts: Iterable[Coverage]) -> Coverage:
    """The sum over many rollouts (their left_out turns are counted in turns - covered_turns, not listed)."""
    total = Coverage(export=export, rollouts=0)
    for part in parts:
        total.rollouts += part.rollouts
        total.agent_tokens += part.agent_tokens
        total.covered_tokens += part.covered_tokens
        total.turns += part.turns
        total.covered_turns += part.covered_turns
        total.auxiliary_tokens += part.auxiliary_tokens
        total.unattributed_tokens += part.unattributed_tokens
    return total


class RolloutCoverage(BaseModel):
    """One rollout's coverage by each export."""

    trl_row: Coverage
    sequences: Coverage
    steps: Coverage

    def text(self) -> str:
        parts = (self.trl_row, self.sequences, self.steps)
        return "; ".join(f"{FORMAT_NAMES[part.export]} {part.text()}" for part in parts)
