"""Which captured calls OpenCode itself made, and in which of its sessions: the proxy's record is the truth.

OpenCode names its session in an `x-session-id` header on every model call (the proxy records request headers with
lower-case names); a sub-agent (the task tool) runs in a child session with its own id. OpenCode's root session is
the session of the first agent call in the record (no tool runs before OpenCode's first call is answered). Where the
proxy admitted only OpenCode's own connections (`callers_checked`: the local backend's caller check), every session
named in the record is OpenCode's: the root's calls are `agent`, another session's `sub_agent`. Where it could not
(E2B, HF: the tools hold OpenCode's token), only the root session is OpenCode's. A call naming no session, or one
that is not OpenCode's, is `unattributed` (auxiliary calls too): kept in the record, never trained, counted or
allowed to decide the rollout's status. Auxiliary calls in OpenCode's sessions (titles, summaries) keep their kind.

OpenCode's own store (`opencode_store.py`) is a file OpenCode's tools can reach, so it only labels: a sub-agent's
parent where the store names one the record has seen, and a cross-check of its assistant steps against the complete
turns. A session, a parent or a step the store claims and the record contradicts is ignored and named in
`disagreements`; a store that is missing, unreadable or lying costs the parents' labels, never a turn's kind.
"""

from __future__ import annotations

from collections import defaultdict
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
) -> tuple[AttributionCheck, int]:
    for turn in turns:
        turn.session_id = turn.headers.get(SESSION_HEADER) or None
        turn.parent_session_id = None
    root = _root(turns)
    sessions = _own_sessions(turns, root, callers_checked)
    marked = 0
    for turn in turns:
        if turn.session_id is None or turn.session_id not in sessions:
            marked += turn.kind != "unattributed"
            turn.kind = "unattributed"
        elif turn.kind != "auxiliary":
            turn.kind = "agent" if turn.session_id == root else "sub_agent"
    check = AttributionCheck(
        source="headers_only" if store is None else "opencode_store",
        sessions=len(sessions),
        sub_agent_sessions=max(len(sessions) - 1, 0),
        caller_check=callers_checked,
        note=note,
    )
    if store is not None and root is not None:
        _label_parents(check, turns, store, root, sessions)
        _compare(check, store, sessions, [turn for turn in turns if turn.kind in OWN_KINDS])
    return check, marked


def _root(turns: list[RolloutTurn]) -> str | None:
    """OpenCode's root session: the session of the first agent call that names one. A tool runs only once
    OpenCode's first call is answered, so no call of a tool's can come first."""
    first = min(
        (turn for turn in turns if turn.kind in OWN_KINDS and turn.session_id), key=lambda t: t.turn, default=None
    )
    return first.session_id if first is not None else None


def _own_sessions(turns: list[RolloutTurn], root: str | None, callers_checked: bool) -> list[str]:
    """OpenCode's sessions, the root first: every session an agent call named where only OpenCode could call."""
    if root is None:
        return []
    if not callers_checked:
        return [root]
    named = [turn.session_id for turn in sorted(turns, key=lambda t: t.turn) if turn.kind in OWN_KINDS]
    return list(dict.fromkeys(session for session in [root, *named] if session))


def _label_parents(
    check: AttributionCheck, turns: list[RolloutTurn], store: OpenCodeStore, root: str, sessions: list[str]
) -> None:
    """A sub-agent's parent from the store, only where the parent is a session the record has seen (the store
    cannot add a session, remove one or change a turn's kind)."""
    if root not in store.parents:
        check.disagreements.append(f"session {root}: OpenCode's root session is not in OpenCode's store")
    elif store.parents[root] is not None:
        check.disagreements.append(
            f"session {root}: OpenCode's store names a parent ({store.parents[root]}) for the root session (ignored)"
        )
    parents: dict[str, str] = {}
    for session in sessions[1:]:
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
