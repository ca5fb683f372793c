"""Which captured calls OpenCode itself made, and in which of its sessions, from the `x-session-id` the proxy
recorded: the proxy's record is the truth (a multi-step rollout runs OpenCode once per step; each run's first session
is a root). A call not shown to be OpenCode's is `unattributed`: kept, never trained or counted. OpenCode's own store
(opencode_store.py) is within reach of its tools, so it only labels parents and is cross-checked; what it claims
against the record is ignored and named in `disagreements`."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from opencode_env.wire import AttributionCheck, RolloutTurn

SESSION_HEADER = "x-session-id"
OWN_KINDS = ("agent", "sub_agent")


@dataclass(frozen=True)
class StoredStep:
    """One assistant message: a model call OpenCode saw answered (or failed, with `error`)."""

    session_id: str
    created_ms: int
    finish: str | None
    output_tokens: int | None
    error: bool


@dataclass
class OpenCodeStore:
    parents: dict[str, str | None] = field(default_factory=dict)
    """Every session OpenCode recorded, with the session that started it (None for the root)."""
    steps: list[StoredStep] = field(default_factory=list)


def attribute_turns(
    turns: list[RolloutTurn],
    store: OpenCodeStore | None = None,
    note: str | None = None,
    *,
    callers_checked: bool = False,
) -> int:
    """Fill each turn's session (and parent), set its kind as the module doc says; return how many turns were marked
    unattributed."""
    return attribution_check(turns, store, note, callers_checked=callers_checked)[1]


def attribution_check(
    turns: list[RolloutTurn],
    store: OpenCodeStore | None = None,
    note: str | None = None,
    *,
    callers_checked: bool = False,
    starts: Sequence[int] = (),
) -> tuple[AttributionCheck, int]:
    """`starts`: where each run of OpenCode after the first begins in `turns` (a multi-step rollout runs it once per
    step, drained in between): each run's first session is a root of its own."""
    for turn in turns:
        turn.session_id = turn.headers.get(SESSION_HEADER) or None
        turn.parent_session_id = None
    bounds = [0, *sorted(start for start in starts if 0 < start < len(turns)), len(turns)]
    found = [_root(turns[low:high]) for low, high in itertools.pairwise(bounds)]
    roots = list(dict.fromkeys(root for root in found if root is not None))
    sessions = _own_sessions(turns, roots, callers_checked)
    marked = 0
    for turn in turns:
        if turn.session_id is None or turn.session_id not in sessions:
            marked += turn.kind != "unattributed"
            turn.kind = "unattributed"
        elif turn.kind != "auxiliary":
            turn.kind = "agent" if turn.session_id in roots else "sub_agent"
    check = AttributionCheck(
        source="headers_only" if store is None else "opencode_store",
        sessions=len(sessions),
        sub_agent_sessions=len(sessions) - len(roots),
        caller_check=callers_checked,
        note=note,
    )
    if store is not None and roots:
        _label_parents(check, turns, store, roots, sessions)
        _compare(check, store, sessions, [turn for turn in turns if turn.kind in OWN_KINDS])
    return check, marked


def _root(turns: list[RolloutTurn]) -> str | None:
    """OpenCode's root session: the session of the first agent call that names one. A tool runs only once
    OpenCode's first call is answered, so no call of a tool's can come first."""
    first = min(
        (turn for turn in turns if turn.kind in OWN_KINDS and turn.session_id), key=lambda t: t.turn, default=None
    )
    return first.session_id if first is not None else None


def _own_sessions(turns: list[RolloutTurn], roots: list[str], callers_checked: bool) -> list[str]:
    """OpenCode's sessions, the roots first: every session an agent call named where only OpenCode could call."""
    if not roots or not callers_checked:
        return list(roots)
    named = [turn.session_id for turn in sorted(turns, key=lambda t: t.turn) if turn.kind in OWN_KINDS]
    return list(dict.fromkeys(session for session in [*roots, *named] if session))


def _label_parents(
    check: AttributionCheck, turns: list[RolloutTurn], store: OpenCodeStore, roots: list[str], sessions: list[str]
) -> None:
    """A sub-agent's parent from the store, only where the parent is a session the record has seen (the store
    cannot add a session, remove one or change a turn's kind)."""
    for root in roots:
        if root not in store.parents:
            check.disagreements.append(f"session {root}: OpenCode's root session is not in OpenCode's store")
        elif store.parents[root] is not None:
            check.disagreements.append(
                f"session {root}: OpenCode's store names a parent ({store.parents[root]}) for the root session "
                "(ignored)"
            )
    parents: dict[str, str] = {}
    for session in sessions[len(roots) :]:
        if session not in store.parents:
            check.disagreements.append(
                f"session {session}: made calls the proxy captured but is not in OpenCode's store (kept as a "
                "sub-agent, parent unknown)"
            )
            continue
        parent = store.parents[session]
        if parent is None or parent not in sessions or parent == session:
            check.disagreements.append(
                f"session {session}: OpenCode's store names parent {parent}, which made no call the proxy captured "
                "(ignored, parent unknown)"
            )
            continue
        parents[session] = parent
    for session in store.parents:
        if session not in sessions:
            check.disagreements.append(
                f"session {session}: in OpenCode's store but made no call the proxy captured (ignored)"
            )
    for turn in turns:
        if turn.kind == "sub_agent" and turn.session_id in parents:
            turn.parent_session_id = parents[turn.session_id]


def _compare(check: AttributionCheck, store: OpenCodeStore, sessions: list[str], turns: list[RolloutTurn]) -> None:
    """Per session of OpenCode's, in order: each answered step in the store against each complete turn of the
    proxy's. Steps in sessions the record never saw are ignored (reported by _label_parents)."""
    recorded: dict[str, list[StoredStep]] = defaultdict(list)
    for step in store.steps:
        if not step.error and step.session_id in sessions:
            recorded[step.session_id].append(step)
    check.steps_recorded = sum(len(steps) for steps in recorded.values())
    captured: dict[str, list[RolloutTurn]] = defaultdict(list)
    for turn in turns:
        if turn.outcome == "complete":
            captured[turn.session_id or ""].append(turn)
    for session in sessions:
        mine, theirs = captured[session], recorded[session]
        for step, turn in zip(theirs, mine, strict=False):
            check.turns_matched += 1
            sampled = turn.usage.completion_tokens
            if step.output_tokens is not None and sampled is not None and step.output_tokens > sampled:
                check.disagreements.append(
                    f"turn {turn.turn} ({session}): OpenCode counted {step.output_tokens} output tokens, the engine "
                    f"sent {sampled}"
                )
        for step in theirs[len(mine) :]:
            check.disagreements.append(
                f"step at {step.created_ms} ms ({session}, finish {step.finish}): recorded by OpenCode, no complete "
                "turn in the proxy's record"
            )
        for turn in mine[len(theirs) :]:
            check.disagreements.append(f"turn {turn.turn} ({session}): no step in OpenCode's store")
