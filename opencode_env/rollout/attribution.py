"""Which captured calls OpenCode itself made, and in which of its sessions.

OpenCode names its session in an `x-session-id` header on every model call (the proxy records request headers with
lower-case names); a sub-agent (the task tool) runs in a child session with its own id. Where OpenCode's own store
could be read (`opencode_store.py`), it says which sessions exist and which started which: a call in the root
session is `agent`, one in a descendant `sub_agent` (with its parent), anything else `unattributed`, and the store's
assistant steps are checked against the complete turns, session by session. Without the store (the headers only),
the first session named is OpenCode's, and a call naming no session or another one is `unattributed`: kept in the
record, never trained. Auxiliary calls (titles, summaries: no tools) keep their kind.
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

    def root_of(self, session: str) -> str | None:
        """The root session a session descends from (None when the session is not in the store)."""
        seen: set[str] = set()
        while session in self.parents and session not in seen:
            seen.add(session)
            parent = self.parents[session]
            if parent is None:
                return session
            session = parent
        return None


def attribute_turns(turns: list[RolloutTurn], store: OpenCodeStore | None = None, note: str | None = None) -> int:
    """Fill each turn's session (and parent), set its kind as the module doc says; return how many turns were marked
    unattributed."""
    return attribution_check(turns, store, note)[1]


def attribution_check(
    turns: list[RolloutTurn], store: OpenCodeStore | None = None, note: str | None = None
) -> tuple[AttributionCheck, int]:
    for turn in turns:
        turn.session_id = turn.headers.get(SESSION_HEADER) or None
    if store is None:
        return AttributionCheck(source="headers_only", note=note), _by_headers(turns)
    root = _root(turns, store)
    marked = 0
    for turn in turns:
        if turn.kind not in (*OWN_KINDS, "unattributed"):
            continue
        session = turn.session_id
        if session is None or root is None or store.root_of(session) != root:
            marked += turn.kind != "unattributed"
            turn.kind = "unattributed"
        elif session == root:
            turn.kind = "agent"
        else:
            turn.kind, turn.parent_session_id = "sub_agent", store.parents[session]
    sessions = [session for session in store.parents if root is not None and store.root_of(session) == root]
    steps = [step for step in store.steps if step.session_id in sessions]
    check = AttributionCheck(
        source="opencode_store",
        sessions=len(sessions),
        sub_agent_sessions=len(sessions) - (root is not None),
        steps_recorded=sum(not step.error for step in steps),
    )
    _compare(check, steps, [turn for turn in turns if turn.kind in OWN_KINDS and turn.outcome == "complete"])
    return check, marked


def _by_headers(turns: list[RolloutTurn]) -> int:
    session = next((turn.session_id for turn in turns if turn.kind == "agent" and turn.session_id), None)
    marked = 0
    for turn in turns:
        if turn.kind == "agent" and (session is None or turn.session_id != session):
            turn.kind = "unattributed"
            marked += 1
    return marked


def _root(turns: list[RolloutTurn], store: OpenCodeStore) -> str | None:
    """OpenCode's root session: the root of the first own call's session that the store knows."""
    for turn in turns:
        if turn.kind in OWN_KINDS and turn.session_id and (root := store.root_of(turn.session_id)):
            return root
    return None


def _compare(check: AttributionCheck, steps: list[StoredStep], turns: list[RolloutTurn]) -> None:
    """Per session, in order: each answered step of OpenCode's against each complete turn of the proxy's."""
    recorded: dict[str, list[StoredStep]] = defaultdict(list)
    for step in steps:
        if not step.error:
            recorded[step.session_id].append(step)
    captured: dict[str, list[RolloutTurn]] = defaultdict(list)
    for turn in turns:
        captured[turn.session_id or ""].append(turn)
    for session in sorted(set(recorded) | set(captured)):
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
                f"session {session}: a step OpenCode recorded (finish {step.finish}, at {step.created_ms} ms) has no "
                "complete turn in the proxy's record"
            )
        for turn in mine[len(theirs) :]:
            check.disagreements.append(f"turn {turn.turn} ({session}): no step in OpenCode's store")
