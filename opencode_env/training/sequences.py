"""A rollout as training sequences: the engine's own token ids, an environment mask, and every fork recorded.

Pure: reads a RolloutResult, runs nothing. The rule (the accepted multi-turn merge): a sequence starts with an
agent turn's engine `prompt_token_ids`; each turn appends its completion (mask 1, its logprobs); when the next
turn's prompt ids start with the sequence so far, the extra suffix (tool output, template tokens) is appended with
mask 0 and logprob 0.0. When no open sequence is a prefix of the next prompt (template drift, compaction, a
rewritten history), a new sequence starts and the fork is recorded. Text is never re-tokenized.

Each session is merged on its own: the root agent's turns (kind "agent") and each sub-agent session's (kind
"sub_agent", by session_id), so a sub-agent's conversation forms its own sequences, and forks are only looked for
within a session. The final sequence (the TRL row) is the root agent's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from opencode_env.training.coverage import (
    Coverage,
    RolloutCoverage,
    SessionKey,
    SessionKind,
    coverage,
    ids_problem,
    rollout_failure,
    trainable_sessions,
)
from opencode_env.training.steps import steps_coverage
from opencode_env.wire import RolloutResult, RolloutStatus, RolloutTurn, TurnKind, common_prefix_length
from opencode_env.wire.notices import Notice, notice_lines, reconciled

SequenceStart = Literal["first", "drift", "after_unusable_turn", "step"]
"""Why a sequence started: its session's first usable turn; a prompt that extends no open sequence (a fork
is recorded); the turn after an agent turn whose ids could not be used (its tokens would be masked as
environment tokens otherwise, so the sequence is cut there rather than mislabelled); or the first agent turn of a
multi-step task's later step (each step's agent is a new session: no sequence spans two steps, whatever the ids)."""

ForkCause = Literal["template_drift", "history_rewritten"]
"""template_drift: the message history was append-only but the engine's prompt ids were not (a chat template that
drops earlier reasoning, a re-rendering that changes tokens). history_rewritten: the messages themselves changed
(OpenCode compacting the conversation, a truncated history)."""


class TrainingSequence(BaseModel):
    """One trainable sequence: `prompt_ids` then `completion_ids`, with a logprob and a mask per completion id.

    `env_mask[i]` is 1 for a token the model generated (its logprob is the engine's) and 0 for a token the
    environment inserted between turns (logprob 0.0). The last completion id is the last turn's last token as the
    engine sent it (its stop token when it stopped), so a trainer reads truncation from it.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    env_mask: list[int] = Field(default_factory=list)
    turns: list[int] = Field(default_factory=list, description="RolloutTurn.turn of each turn it covers, in order.")
    started: SequenceStart = "first"
    reward: float | None = None
    status: RolloutStatus = "completed"
    task_id: str = ""
    usable: bool = True
    unusable_reason: str | None = None
    kind: SessionKind = Field("agent", description="agent: the root session's; sub_agent: a sub-agent session's.")
    session_id: str | None = Field(None, description="The OpenCode session whose turns it holds, when recorded.")
    parent_session_id: str | None = Field(None, description="For a sub-agent's sequence: the session that started it.")


class Fork(BaseModel):
    """Where a turn's prompt left the sequence it shares the most with."""

    turn: int = Field(description="RolloutTurn.turn of the turn whose prompt did not extend the sequence.")
    sequence: int = Field(description="Index of the sequence it forked from.")
    position: int = Field(description="First position (in prompt_ids + completion_ids) where they differ.")
    sequence_id: int | None = Field(description="The sequence's id there (None: the prompt is longer).")
    prompt_id: int | None = Field(description="The turn's prompt id there (None: the prompt is shorter).")
    cause: ForkCause


class SkippedTurn(BaseModel):
    turn: int
    reason: str


class TrainingSequences(BaseModel):
    sequences: list[TrainingSequence] = Field(default_factory=list)
    forks: list[Fork] = Field(default_factory=list)
    skipped: list[SkippedTurn] = Field(
        default_factory=list,
        description="Agent and sub-agent turns in no sequence, with why (not auxiliary or unattributed turns).",
    )
    unattributed: list[int] = Field(
        default_factory=list,
        description="Turns the proxy could not tie to OpenCode's session (rollout.attribution): in no sequence.",
    )
    no_sequences_reason: str | None = None

    def final(self) -> TrainingSequence | None:
        """The root agent's sequence that holds its last usable turn (sub-agents' sequences are never final)."""
        root = [sequence for sequence in self.sequences if sequence.kind == "agent"]
        return max(root, key=lambda sequence: sequence.turns[-1]) if root else None


class KindUsage(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class TrainingSummary(BaseModel):
    """What a user checks at a glance before training on a rollout."""

    sequences: int
    usable: bool
    forks: list[Fork]
    skipped: list[SkippedTurn]
    unattributed: list[int] = Field(description="Turns not tied to OpenCode's session, never trained.")
    no_sequences_reason: str | None
    all_aligned: bool = Field(description="Every completed turn has len(ids) == len(logprobs) == completion tokens.")
    misaligned_turns: list[int]
    usage_by_kind: dict[TurnKind, KindUsage]
    sub_agent_sequences: int = 0
    coverage: RolloutCoverage = Field(description="How many of the rollout's agent tokens each export carries.")
    warnings: list[str] = Field(default_factory=list, description="The result's warnings (RolloutResult.warnings).")
    notices: list[Notice] = Field(default_factory=list, description="The same, typed (RolloutResult.notices).")

    def text(self) -> str:
        usage = "; ".join(
            f"{kind} {u.calls} calls, {u.prompt_tokens} prompt + {u.completion_tokens} completion tokens"
            for kind, u in self.usage_by_kind.items()
        )
        forks = ", ".join(f"turn {f.turn} at {f.position} ({f.cause})" for f in self.forks) or "none"
        aligned = "yes" if self.all_aligned else f"no (turns {self.misaligned_turns})"
        sub_agents = f" ({self.sub_agent_sequences} of sub-agents)" if self.sub_agent_sequences else ""
        lines = [
            f"sequences:  {self.sequences}{sub_agents}" + ("" if self.usable else " (unusable)"),
            f"forks:      {forks}",
            f"aligned:    {aligned}",
            f"usage:      {usage or 'no calls'}",
            f"coverage:   {self.coverage.text()}",
        ]
        if self.skipped:
            lines.append("skipped:    " + ", ".join(f"turn {s.turn} ({s.reason})" for s in self.skipped))
        if self.unattributed:
            lines.append(f"unattributed: turns {self.unattributed} (not OpenCode's session, never trained)")
        if self.no_sequences_reason:
            lines.append(f"no sequences: {self.no_sequences_reason}")
        lines += notice_lines(reconciled(self.notices, self.warnings))
        return "\n".join(lines)


@dataclass
class _Open:
    index: int
    ids: list[int]
    last_position: int = 0


def unattributed_turns(result: RolloutResult) -> list[int]:
    return [turn.turn for turn in result.proxy_turns if turn.kind == "unattributed"]


def _cause(result: RolloutResult, earlier: int, later: int) -> ForkCause:
    before, after = result.turn_messages(earlier), result.turn_messages(later)
    return "template_drift" if after[: len(before)] == before else "history_rewritten"


def _no_ids_reason(turns: list[RolloutTurn]) -> str:
    sources = sorted({turn.token_id_source for turn in turns})
    return (
        f"none of the {len(turns)} completed agent and sub-agent turns carries engine token ids (token_id_source: "
        f"{', '.join(sources)}); OpenAI and the Hugging Face router return none: train against a vllm endpoint"
    )


def _no_turns_reason(result: RolloutResult) -> str:
    if result.proxy_turns:
        return "no agent turn completed (only auxiliary, unattributed or failed calls)"
    if result.mode == "black_box":
        return "no turns were captured (black_box mode)"
    if result.oracle:
        return "an oracle run: no model was called"
    return f"no model call was recorded (status {result.status}{': ' + result.error[:200] if result.error else ''})"


def training_sequences(result: RolloutResult) -> TrainingSequences:
    """The rollout's agent and sub-agent turns as training sequences, with forks and skipped turns recorded."""
    out = TrainingSequences(unattributed=unattributed_turns(result))
    sessions = trainable_sessions(result)
    trainable = [turn for turns in sessions.values() for turn in turns]
    if not trainable:
        out.no_sequences_reason = _no_turns_reason(result)
        return _mark(out, result)
    if all(ids_problem(turn) for turn in trainable):
        out.no_sequences_reason = _no_ids_reason(trainable)
        out.skipped = [SkippedTurn(turn=turn.turn, reason=str(ids_problem(turn))) for turn in trainable]
        return _mark(out, result)
    positions = {turn.turn: index for index, turn in enumerate(result.proxy_turns)}
    for key, turns in sessions.items():
        _merge_session(result, out, key, turns, positions)
    return _mark(out, result)


def _merge_session(
    result: RolloutResult, out: TrainingSequences, key: SessionKey, turns: list[RolloutTurn], positions: dict[int, int]
) -> None:
    kind, session_id, step = key
    session_id = session_id or next((turn.session_id for turn in turns if turn.session_id), None)
    parent_session_id = next((turn.parent_session_id for turn in turns if turn.parent_session_id), None)
    open_sequences: list[_Open] = []
    after_gap = False
    later_step = kind == "agent" and step > 0
    for turn in turns:
        problem = ids_problem(turn)
        if problem:
            out.skipped.append(SkippedTurn(turn=turn.turn, reason=problem))
            open_sequences, after_gap = [], True
            continue
        target = _extended(open_sequences, turn.prompt_token_ids)
        if target is None:
            start: SequenceStart = (
                "step" if later_step else "after_unusable_turn" if after_gap else "drift" if open_sequences else "first"
            )
            if start == "drift":
                out.forks.append(_fork(result, open_sequences, turn, positions))
            target = _Open(len(out.sequences), list(turn.prompt_token_ids))
            out.sequences.append(
                TrainingSequence(
                    prompt_ids=list(turn.prompt_token_ids),
                    started=start,
                    kind=kind,
                    session_id=session_id,
                    parent_session_id=parent_session_id,
                )
            )
            open_sequences.append(target)
            later_step = False
        else:
            suffix = turn.prompt_token_ids[len(target.ids) :]
            sequence = out.sequences[target.index]
            sequence.completion_ids.extend(suffix)
            sequence.logprobs.extend([0.0] * len(suffix))
            sequence.env_mask.extend([0] * len(suffix))
            target.ids.extend(suffix)
        after_gap = False
        sequence = out.sequences[target.index]
        sequence.completion_ids.extend(turn.completion_token_ids)
        sequence.logprobs.extend(turn.per_token_logps)
        sequence.env_mask.extend([1] * len(turn.completion_token_ids))
        sequence.turns.append(turn.turn)
        target.ids.extend(turn.completion_token_ids)
        target.last_position = positions[turn.turn]
        open_sequences.remove(target)
        open_sequences.append(target)


def _extended(open_sequences: list[_Open], prompt: list[int]) -> _Open | None:
    """The most recently extended open sequence that the prompt starts with."""
    for candidate in reversed(open_sequences):
        if len(prompt) >= len(candidate.ids) and prompt[: len(candidate.ids)] == candidate.ids:
            return candidate
    return None


def _fork(result: RolloutResult, open_sequences: list[_Open], turn: RolloutTurn, positions: dict[int, int]) -> Fork:
    prompt = turn.prompt_token_ids
    nearest = max(reversed(open_sequences), key=lambda s: common_prefix_length(s.ids, prompt))
    position = common_prefix_length(nearest.ids, prompt)
    return Fork(
        turn=turn.turn,
        sequence=nearest.index,
        position=position,
        sequence_id=nearest.ids[position] if position < len(nearest.ids) else None,
        prompt_id=prompt[position] if position < len(prompt) else None,
        cause=_cause(result, nearest.last_position, positions[turn.turn]),
    )


def _mark(out: TrainingSequences, result: RolloutResult) -> TrainingSequences:
    failure = rollout_failure(result)
    for sequence in out.sequences:
        sequence.reward, sequence.status, sequence.task_id = result.reward, result.status, result.task_id
        if failure:
            sequence.usable, sequence.unusable_reason = False, failure
    return out


def sequences_coverage(result: RolloutResult, found: TrainingSequences | None = None) -> Coverage:
    """How many of the rollout's agent tokens its usable sequences (every session's) carry."""
    found = found if found is not None else training_sequences(result)
    reasons = {skipped.turn: skipped.reason for skipped in found.skipped}
    for sequence in found.sequences:
        if not sequence.usable:
            reasons.update(dict.fromkeys(sequence.turns, sequence.unusable_reason or "an unusable sequence"))
    carried = [turn for sequence in found.sequences if sequence.usable for turn in sequence.turns]
    return coverage(result, "sequences", carried, reasons)


def trl_row_coverage(result: RolloutResult, found: TrainingSequences | None = None) -> Coverage:
    """How many of the rollout's agent tokens its TRL row (the root agent's final sequence) carries."""
    found = found if found is not None else training_sequences(result)
    final = found.final()
    reasons = {skipped.turn: skipped.reason for skipped in found.skipped}
    for index, sequence in enumerate(found.sequences):
        if sequence is final:
            reason = sequence.unusable_reason or "an unusable sequence"
        elif sequence.kind == "sub_agent":
            reason = "a sub-agent's turn: in its session's own sequence, not the root agent's"
        else:
            reason = f"in sequence {index}, not the final one (a fork: export sequences or steps to keep it)"
        reasons.update(dict.fromkeys(sequence.turns, reason))
    carried = final.turns if final is not None and final.usable else []
    return coverage(result, "trl_row", carried, reasons)


def training_summary(result: RolloutResult, sequences: TrainingSequences | None = None) -> TrainingSummary:
    found = sequences if sequences is not None else training_sequences(result)
    usage: dict[TurnKind, KindUsage] = {}
    misaligned = []
    for turn in result.proxy_turns:
        if turn.outcome != "complete":
            continue
        if not turn.aligned:
            misaligned.append(turn.turn)
        kind = usage.setdefault(turn.kind, KindUsage())
        kind.calls += 1
        kind.prompt_tokens += turn.usage.prompt_tokens or 0
        kind.completion_tokens += turn.usage.completion_tokens or 0
    return TrainingSummary(
        sequences=len(found.sequences),
        sub_agent_sequences=sum(1 for sequence in found.sequences if sequence.kind == "sub_agent"),
        usable=bool(found.sequences) and all(s.usable for s in found.sequences),
        forks=found.forks,
        skipped=found.skipped,
        unattributed=found.unattributed,
        no_sequences_reason=found.no_sequences_reason,
        all_aligned=not misaligned,
        misaligned_turns=misaligned,
        usage_by_kind=usage,
        coverage=RolloutCoverage(
            trl_row=trl_row_coverage(result, found),
            sequences=sequences_coverage(result, found),
            steps=steps_coverage(result),
        ),
        warnings=result.warnings,
        notices=result.warning_notices(),
    )


TRL_ROW_WARNING_BELOW = 0.9
"""A rollout whose TRL row carries less than this share of its agent tokens says so in its warnings."""
TOKEN_IN_FIX = (
    "run with token_in='auto' (or 'require') against a server that takes prompt ids (vLLM 0.32 or later, or "
    "prime-rl's vLLM server), so every turn extends the last; or export sequences or steps, which keep every turn"
)


def trl_row_warning(result: RolloutResult, found: TrainingSequences | None = None) -> str | None:
    """What the result says when its TRL row (what TRL's GRPO `rollout_func` trains on) carries less than
    TRL_ROW_WARNING_BELOW of its agent tokens: how much, why (forks by cause, sub-agents, turns without ids) and the
    fix. None when it carries enough, or when other warnings already say why nothing can be trained (no ids, a
    rollout that failed on our side)."""
    if rollout_failure(result) is not None or not result.proxy_turns:
        return None
    found = found if found is not None else training_sequences(result)
    if found.no_sequences_reason is not None:
        return None
    row = trl_row_coverage(result, found)
    if row.fraction is None or row.fraction >= TRL_ROW_WARNING_BELOW:
        return None
    causes = []
    drift = sum(fork.cause == "template_drift" for fork in found.forks)
    rewritten = sum(fork.cause == "history_rewritten" for fork in found.forks)
    if drift:
        fallbacks = sorted({t.token_in_fallback for t in result.proxy_turns if t.token_in_fallback and t.turn > 0})
        why = f"; token-in fell back: {fallbacks[0][:200]}" if fallbacks else ""
        causes.append(f"{drift} fork(s) where the chat template's prompt did not extend the last turn{why}")
    if rewritten:
        causes.append(f"{rewritten} fork(s) where OpenCode rewrote the history (compaction)")
    if any(sequence.kind == "sub_agent" for sequence in found.sequences):
        causes.append("sub-agents' turns, which are in their own sequences")
    if found.skipped:
        causes.append(f"{len(found.skipped)} turn(s) whose ids cannot be trained on")
    fix = TOKEN_IN_FIX if drift else "export sequences or steps, which keep every turn"
    return f"the TRL row holds {row.text()}: {'; '.join(causes) or 'turns left out'}. Fix: {fix}"
