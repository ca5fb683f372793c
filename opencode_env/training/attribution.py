"""Which captured calls OpenCode itself made: a fallback for backends where the agent's tools can reach the proxy.

OpenCode names its one session in an `x-session-id` header on every model call (sub-agents are off in our
config); the proxy records request headers with lower-case names. A call without that header, or naming another
session, came from something else in the sandbox (a tool, a script the agent wrote) and is never trained.
"""

from __future__ import annotations

from opencode_env.wire.models import RolloutTurn

SESSION_HEADER = "x-session-id"


def attribute_turns(turns: list[RolloutTurn]) -> int:
    """Fill each turn's session_id from its header, and mark as "unattributed" every agent turn that does not name
    OpenCode's session; return how many were marked.

    OpenCode's session is the one named by the first agent turn (in `turns`' order) that names one. Auxiliary and
    sub-agent turns are left as they are; a second call marks nothing more.
    """
    for turn in turns:
        turn.session_id = _session_of(turn)
    session = _opencode_session(turns)
    marked = 0
    for turn in turns:
        if turn.kind == "agent" and (session is None or _session_of(turn) != session):
            turn.kind = "unattributed"
            marked += 1
    return marked


def _opencode_session(turns: list[RolloutTurn]) -> str | None:
    return next((session for turn in turns if turn.kind == "agent" and (session := _session_of(turn))), None)


def _session_of(turn: RolloutTurn) -> str | None:
    return turn.headers.get(SESSION_HEADER) or None
