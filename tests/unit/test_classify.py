"""How the agent phase's ending is named, one row per branch of `classify_agent_phase`: what the sandbox reported,
what the proxy recorded, and the status and message the result then carries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opencode_env.rollout.classify import classify_agent_phase
from opencode_env.rollout.state import PhaseFailure
from opencode_env.wire import RolloutRequest, RolloutResult, RolloutStatus, RolloutTurn, TokenUsage
from opencode_env.wire.mcp import McpServer
from opencode_env.wire.result import is_infrastructure_failure
from opencode_env.wire.services import Service

OVERFLOW = "This model's maximum context length is 32768 tokens. Your prompt contains at least 40000 input tokens."


def turns(*outcomes: str, error: str | None = None, status: int | None = 200) -> list[RolloutTurn]:
    return [
        RolloutTurn(turn=n, outcome=o, upstream_status=status, upstream_error=error) for n, o in enumerate(outcomes)
    ]


def result(proxy_turns: list[RolloutTurn], *, exit_code: int | None = 1, log_tail: str = "") -> RolloutResult:
    return RolloutResult(
        proxy_turns=proxy_turns,
        agent_exit_code=exit_code,
        agent_log_tail=log_tail,
        usage=TokenUsage(llm_calls=len(proxy_turns), source="proxy"),
    )


AGENT_EXIT = PhaseFailure("agent_error", "agent", "OpenCode exited 1")
AGENT_LATE = PhaseFailure("agent_timeout", "agent", "the agent ran past its 600s limit and was stopped")

CASES: list[tuple[str, PhaseFailure | None, RolloutResult, bool, RolloutStatus | None, str, str | None]] = [
    # id, reported, result, proxy died, status, message contains, last turn's outcome afterwards
    ("clean", None, result(turns("complete"), exit_code=0), False, None, "", "complete"),
    (
        "proxy error wins",
        PhaseFailure("proxy_error", "agent", "no proxy"),
        result([]),
        True,
        "proxy_error",
        "no proxy",
        None,
    ),
    ("proxy died", None, result(turns("complete"), exit_code=0), True, "proxy_error", "capture proxy died", "complete"),
    ("never called the model", None, result([], exit_code=0), False, "agent_error", "without calling the model", None),
    ("setup failure passes", PhaseFailure("setup_failed", "setup", "x"), result([]), False, "setup_failed", "x", None),
    (
        "deadline cut a stream",
        AGENT_LATE,
        result(turns("complete", "client_disconnected")),
        False,
        "agent_timeout",
        "past its",
        "cut_by_deadline",
    ),
    (
        "deadline cut a read",
        AGENT_LATE,
        result(turns("complete", "undelivered")),
        False,
        "agent_timeout",
        "past its",
        "cut_by_deadline",
    ),
    (
        "context overflow",
        AGENT_EXIT,
        result(turns("upstream_error", error=OVERFLOW, status=400)),
        False,
        "agent_error",
        "exceeded the model's context",
        "upstream_error",
    ),
    (
        "overflow then a clean turn",
        AGENT_EXIT,
        result([*turns("upstream_error", error=OVERFLOW, status=400), *turns("complete")]),
        False,
        "agent_error",
        "exceeded the model's context",
        "complete",
    ),
    (
        "last call failed",
        AGENT_EXIT,
        result(turns("complete", "unreachable", error="refused")),
        False,
        "upstream_error",
        "the last model call failed (unreachable",
        "unreachable",
    ),
    (
        "timeout while stalled",
        AGENT_LATE,
        result(turns("stalled", error="no byte")),
        False,
        "upstream_error",
        "(stalled",
        "stalled",
    ),
    (
        "agent dropped its own stream",
        AGENT_EXIT,
        result(turns("client_disconnected")),
        False,
        "agent_error",
        "OpenCode exited 1",
        "client_disconnected",
    ),
    (
        "no turn, API error in log",
        AGENT_EXIT,
        result([], log_tail="AI_APICallError: APIError"),
        False,
        "upstream_error",
        "see agent_log_tail",
        None,
    ),
    ("no turn, plain crash", AGENT_EXIT, result([], log_tail="segfault"), False, "agent_error", "exited 1", None),
    ("plain timeout", AGENT_LATE, result(turns("complete")), False, "agent_timeout", "past its", "complete"),
    (
        "deadline cut a retry of a failing model",
        AGENT_LATE,
        result(turns("upstream_error", "upstream_error", "client_disconnected", error="HTTP 500", status=500)),
        False,
        "upstream_error",
        "the last model call failed (upstream_error, HTTP 500)",
        "cut_by_deadline",
    ),
    (
        "deadline cut a retry of an unreachable model",
        AGENT_LATE,
        result(turns("unreachable", "undelivered", error="refused", status=None)),
        False,
        "upstream_error",
        "(unreachable",
        "cut_by_deadline",
    ),
    (
        "a forged call's failure is not the model's",
        AGENT_EXIT,
        result([*turns("complete"), RolloutTurn(turn=1, outcome="upstream_error", kind="unattributed")]),
        False,
        "agent_error",
        "OpenCode exited 1",
        "upstream_error",
    ),
    (
        "a request the proxy could not read is not the model's failure",
        AGENT_EXIT,
        result(turns("complete", "bad_request", error="not JSON", status=None)),
        False,
        "agent_error",
        "OpenCode exited 1",
        "bad_request",
    ),
]


@pytest.mark.parametrize(
    ("reported", "rollout", "proxy_died", "status", "message", "last_outcome"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_agent_phase_ending_is_named_for_what_happened(
    reported: PhaseFailure | None,
    rollout: RolloutResult,
    proxy_died: bool,
    status: RolloutStatus | None,
    message: str,
    last_outcome: str | None,
) -> None:
    named = classify_agent_phase(reported, rollout, proxy_died)
    assert (named.status if named else None) == status
    assert message in (str(named) if named else "")
    assert (rollout.proxy_turns[-1].outcome if rollout.proxy_turns else None) == last_outcome


SERVER_NAMES = ["kv", "kv_admin", "docs", "a-b"]
tool_names = st.one_of(
    st.sampled_from(["bash", "read", "kv_get", "kv_admin_drop", "docs_search", "a-b_x", "kvx_get", "docs"]),
    st.text("abkvdocs_-", max_size=12),
)


@settings(max_examples=400, deadline=None)
@given(
    case=st.sampled_from(CASES),
    declared=st.lists(st.sampled_from(SERVER_NAMES), unique=True, max_size=4),
    sent=st.lists(st.lists(tool_names, max_size=5), max_size=3),
)
def test_an_agent_without_a_tasks_mcp_server_never_earns_an_outcome_of_its_own(
    case: tuple[str, PhaseFailure | None, RolloutResult, bool, RolloutStatus | None, str, str | None],
    declared: list[str],
    sent: list[list[str]],
) -> None:
    """Over every ending above, any declared servers and any tools the agent's calls carried: when a declared
    server's tools were in no call (so not in the first, sent before the agent did anything), the agent ran in an
    environment that was not the task's: an ending that would be the agent's (clean, its error, its timeout) is an
    infrastructure failure naming the server instead; any other ending, and every ending when each server's tools
    were sent, is what it is without servers."""
    _, reported, rollout, proxy_died, _, _, _ = case
    services = [Service(name=name.replace("_", "-"), image="x", command=["true"]) for name in declared]
    servers = [
        McpServer(name=name, transport="streamable-http", url=f"http://{name.replace('_', '-')}:8000/mcp")
        for name in declared
    ]
    with_servers = rollout.model_copy(
        deep=True,
        update={
            "task": RolloutRequest(instruction="x", services=services, mcp_servers=servers),
            "request_tools": {
                str(n): [{"type": "function", "function": {"name": name}} for name in names]
                for n, names in enumerate(sent)
            },
        },
    )
    named = classify_agent_phase(reported, with_servers, proxy_died)
    alone = classify_agent_phase(reported, rollout.model_copy(deep=True), proxy_died)
    served = {name for name in declared for names in sent for tool in names if _owner(tool, declared) == name}
    unserved = [name for name in declared if name not in served] if sent else []
    if not unserved:
        assert (named and (named.status, str(named))) == (alone and (alone.status, str(alone)))
        return
    assert named is not None, unserved
    if alone is None or alone.status in ("agent_error", "agent_timeout"):
        assert named.status == "sandbox_error"
        assert is_infrastructure_failure(named.status)
        assert all(f"mcp_servers.{name}" in str(named) for name in unserved), str(named)
    else:
        assert (named.status, str(named)) == (alone.status, str(alone)), "an ending that is not the agent's stays"


def _owner(tool: str, servers: list[str]) -> str | None:
    """The server a tool is OpenCode's name for (`<server>_<tool>`, the longest such server)."""
    owners = [name for name in servers if tool.startswith(f"{name}_")]
    return max(owners, key=len) if owners else None
