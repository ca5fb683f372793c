"""Whose fault: what the agent phase really ended with, decided once, from OpenCode's own calls only."""

from __future__ import annotations

import re

from opencode_env.rollout.opencode_mcp import unserved_servers
from opencode_env.rollout.state import PhaseFailure
from opencode_env.wire import (
    RolloutResult,
    RolloutTurn,
)


def classify_agent_phase(failure: PhaseFailure | None, result: RolloutResult, proxy_died: bool) -> PhaseFailure | None:
    """What the agent phase really ended with, decided from OpenCode's own calls only (a call the proxy could not
    attribute to OpenCode never makes the rollout an infrastructure failure). A rollout that only looks clean (the
    agent exited 0 without ever calling the model) fails; a timeout or crash caused by the model or the proxy says
    so: a deadline that hits while OpenCode retries a failing model is the model's failure, however busy the
    machine was. An agent that ran without a task's MCP server (none of its tools in any call, so not in the first,
    made before the agent did anything) ran in an environment that was not the task's: no outcome of its counts."""
    outcome = _agent_outcome(failure, result, proxy_died)
    unserved = unserved_servers(result.task.mcp_servers, result.request_tools) if result.task is not None else []
    if unserved and (outcome is None or outcome.status in AGENT_OUTCOMES):
        names = ", ".join(f"mcp_servers.{name}" for name in unserved)
        message = (
            f"{names}: none of its tools reached the model (OpenCode could not connect to it or list its tools before "
            "the agent's first call), so the agent ran without the task's tools"
        )
        return PhaseFailure("sandbox_error", "agent", f"{failure}; {message}" if failure is not None else message)
    return outcome


AGENT_OUTCOMES = ("agent_error", "agent_timeout")
"""What the agent phase ends with when the failure is the agent's (or the task's, through the agent)."""


def _agent_outcome(failure: PhaseFailure | None, result: RolloutResult, proxy_died: bool) -> PhaseFailure | None:
    turns = [turn for turn in result.proxy_turns if turn.kind != "unattributed"]
    if failure is not None and failure.status == "proxy_error":
        return failure
    if proxy_died:
        return PhaseFailure("proxy_error", "agent", "the capture proxy died while the agent ran")
    if failure is None:
        if result.agent_exit_code == 0 and result.usage.llm_calls == 0:
            return PhaseFailure("agent_error", "agent", "OpenCode exited 0 without calling the model")
        return None
    if failure.status not in AGENT_OUTCOMES:
        return failure
    if failure.status == "agent_timeout" and turns and turns[-1].outcome in AGENT_SIDE_CUTS:
        # Our deadline killed the agent mid-call or mid-read: that turn was cut by us, not failed by the model.
        turns[-1].outcome = "cut_by_deadline"
        turns = turns[:-1]
    overflow = _context_overflow(turns)
    last_failed = bool(turns) and turns[-1].outcome in MODEL_FAILURES
    if overflow is not None and (not last_failed or _context_overflow(turns[-1:]) is not None):
        return PhaseFailure("agent_error", "agent", f"{failure}; the prompt exceeded the model's context: {overflow}")
    if last_failed:
        last = turns[-1]
        return PhaseFailure(
            "upstream_error",
            "agent",
            f"{failure}; the last model call failed ({last.outcome}, "
            f"HTTP {last.upstream_status}): {(last.upstream_error or '')[:500]}",
        )
    if not turns and "APIError" in result.agent_log_tail:
        return PhaseFailure("upstream_error", "agent", f"{failure}; the model call failed (see agent_log_tail)")
    return failure


AGENT_SIDE_CUTS = ("client_disconnected", "undelivered")
"""Turn outcomes where the model answered and the agent's side went away before taking in the whole answer."""
MODEL_FAILURES = ("upstream_error", "stalled", "unreachable", "upstream_disconnected")
"""Turn outcomes where the model endpoint failed a call (a 400 on the context is told apart by its words)."""
CONTEXT_OVERFLOW = re.compile(
    r"maximum context length|context length|prompt contains at least \d+ input tokens|context window|too many tokens",
    re.IGNORECASE,
)


def _context_overflow(turns: list[RolloutTurn]) -> str | None:
    """The model's own words when a call failed because the prompt no longer fits its context (the policy's doing,
    not an infrastructure failure: the reward stands). OpenCode then compacts and may call again before it exits."""
    for turn in reversed(turns):
        error = turn.upstream_error or ""
        if turn.upstream_status == 400 and CONTEXT_OVERFLOW.search(error):
            return error[:300]
    return None
