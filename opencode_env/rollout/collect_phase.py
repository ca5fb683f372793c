"""Collect: the files the agent left, OpenCode's events and logs, and the turns from the proxy's own records."""

from __future__ import annotations

import logging

from opencode_env.rollout import opencode
from opencode_env.rollout.attribution import attribution_check
from opencode_env.rollout.collect import collect_artifacts, collect_files, read_tail
from opencode_env.rollout.opencode_mcp import unserved_servers
from opencode_env.rollout.opencode_store import attribution_store
from opencode_env.rollout.provenance import complete_provenance
from opencode_env.rollout.proxy_session import (
    proxy_log_tail,
    read_trace,
    stop_proxy,
)
from opencode_env.rollout.state import AGENT_STDERR_PATH, EVENTS_PATH, RolloutState
from opencode_env.sandbox.base import (
    PROXY_TRACE_READ_BYTES,
    ProxyHandle,
    Sandbox,
)
from opencode_env.wire import (
    AttributionCheck,
    BudgetRecord,
    TokenUsage,
)
from opencode_env.wire.notices import Notice

log = logging.getLogger("opencode_env.rollout.collect_phase")


async def collect(rollout: RolloutState) -> None:
    result, sandbox = rollout.result, rollout.sandbox
    await rollout.report("collect", "collecting the files and logs")
    files = await collect_files(sandbox, rollout.workdir)
    result.files, result.files_extra, result.files_non_utf8 = files.text, files.extra, files.non_utf8
    if rollout.request.artifacts:
        artifacts = await collect_artifacts(sandbox, rollout.request.artifacts)
        result.artifacts, result.artifacts_extra = artifacts.text, artifacts.extra
    await collect_agent_record(rollout)


async def collect_agent_record(rollout: RolloutState) -> None:
    """OpenCode's events and logs: collected on every path that got past setup, failed or not."""
    result, sandbox = rollout.result, rollout.sandbox
    events = opencode.parse_events(await read_tail(sandbox, EVENTS_PATH, limit=32 * 1024 * 1024))
    result.tool_calls = events.tool_calls
    result.agent_final_text = events.final_text
    if rollout.request.mode == "black_box":
        result.usage = TokenUsage(
            prompt_tokens=events.input_tokens,
            completion_tokens=events.output_tokens,
            llm_calls=events.steps,
            source="opencode_events" if events.steps else "none",
        )
    result.agent_log_tail = await agent_log_tail(sandbox, events.errors)


async def collect_turns(rollout: RolloutState, proxy: ProxyHandle) -> None:
    """Turns and usage come from the proxy's own records, never from a file the sandbox can write; OpenCode's store
    only labels them (attribution.py)."""
    result = rollout.result
    await stop_proxy(proxy)
    trace = await read_trace(proxy)
    result.proxy_turns, result.request_tools = trace.turns, trace.tools
    for name in unserved_servers(rollout.request.mcp_servers, trace.tools):
        result.warn(
            "mcp_server_missing",
            f"mcp_servers.{name}: none of its tools reached the model (OpenCode could not connect to it or list its "
            "tools, and went on without it; agent_log_tail may say why)",
            fix="the server must answer MCP (initialize, then tools/list) at its URL within 60 s of the agent's start",
        )
    for problem in trace.problems:
        log.warning("%s: %s", result.sandbox_id, problem)
    result.proxy_log_tail = await proxy_log_tail(proxy)
    store, note = await attribution_store(rollout.sandbox)
    starts = [part.first_turn for part in result.steps[1:] if part.status != "not_run"]
    result.attribution, unattributed = attribution_check(
        trace.turns, store, note, callers_checked=rollout.sandbox.opencode_isolated, starts=starts
    )
    result.attribution.refused_calls = trace.refused
    if trace.budget is not None:
        result.warn("proxy_trace_bound", budget_warning(trace.budget), fix="give the rollout more disk (disk_mb)")
    for notice in attribution_warnings(result.attribution, store_expected=rollout.sandbox.opencode_isolated):
        result.warn(notice.code, notice.message, severity=notice.severity)
    if unattributed:
        log.warning("%s: %d model calls OpenCode did not make (kept as unattributed)", result.sandbox_id, unattributed)
    complete_provenance(result, rollout.opencode_config, frozenset({proxy.base_url}))
    own = [turn for turn in trace.turns if turn.kind != "unattributed"]
    complete = [turn for turn in own if turn.outcome == "complete"]
    result.usage = TokenUsage(
        prompt_tokens=sum(turn.usage.prompt_tokens or 0 for turn in complete),
        completion_tokens=sum(turn.usage.completion_tokens or 0 for turn in complete),
        llm_calls=len(own),
        source="proxy",
    )


def budget_warning(budget: BudgetRecord) -> str:
    return (
        f"the capture proxy's trace reached its bound of {budget.limit / 2**20:.1f} MiB (a sixteenth of disk_mb, at "
        f"most {PROXY_TRACE_READ_BYTES // 2**20} MiB): the {budget.dropped} model calls after it were relayed to "
        "the agent but not recorded (no turn, no training); the turns before it are kept"
    )


def attribution_warnings(check: AttributionCheck, *, store_expected: bool) -> list[Notice]:
    """What a trainer must hear of: calls refused, and a store that could not be read or contradicts the record
    (attribution never rests on it: the cost is sub-agents' parent labels)."""
    warnings = []
    if check.refused_calls:
        message = (
            f"{check.refused_calls} model calls were refused by the capture proxy (not OpenCode's connection, or no "
            "valid token): never sent to the model, never a turn"
        )
        warnings.append(Notice(code="calls_refused", severity="note", message=message))
    if store_expected and check.sessions and check.note:
        message = (
            f"OpenCode's session store could not be read ({check.note}): calls are attributed by the proxy's record "
            "alone, sub-agents' parents unknown"
        )
        warnings.append(Notice(code="session_store_unread", severity="warning", message=message))
    contradictions = [item for item in check.disagreements if item.startswith("session ")]
    if contradictions:
        message = (
            f"OpenCode's session store contradicts the proxy's record ({len(contradictions)} claims, first: "
            f"{contradictions[0][:300]}): the record stands, the store's claims were ignored"
        )
        warnings.append(Notice(code="session_store_contradicts", severity="warning", message=message))
    return warnings


async def agent_log_tail(sandbox: Sandbox, errors: list[str]) -> str:
    parts = [f"opencode error event: {error}" for error in errors[-5:]]
    stderr = await read_tail(sandbox, AGENT_STDERR_PATH)
    if stderr.strip():
        parts.append(stderr)
    log_dir = f"{sandbox.opencode_data_dir}/opencode/log"
    for entry in await sandbox.list_files(log_dir, limit=10):
        parts.append(await read_tail(sandbox, f"{log_dir}/{entry.path}", limit=4096))
    return "\n".join(parts)[-16384:]
