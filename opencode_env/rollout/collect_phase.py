"""Collect: the files the agent left, OpenCode's events and logs, and the turns from the proxy's own records."""

from __future__ import annotations

import logging

from opencode_env.rollout import opencode
from opencode_env.rollout.attribution import attribution_check
from opencode_env.rollout.collect import collect_files, read_tail
from opencode_env.rollout.opencode_store import attribution_store
from opencode_env.rollout.provenance import complete_provenance
from opencode_env.rollout.proxy_session import (
    proxy_log_tail,
    read_trace,
    stop_proxy,
)
from opencode_env.rollout.state import AGENT_STDERR_PATH, EVENTS_PATH, RolloutState
from opencode_env.sandbox.base import (
    ProxyHandle,
    Sandbox,
)
from opencode_env.wire import (
    AttributionCheck,
    TokenUsage,
)

log = logging.getLogger("opencode_env.rollout.collect_phase")


async def collect(rollout: RolloutState) -> None:
    result, sandbox = rollout.result, rollout.sandbox
    await rollout.report("collect", "collecting the files and logs")
    files = await collect_files(sandbox, rollout.workdir)
    result.files, result.files_extra, result.files_non_utf8 = files.text, files.extra, files.non_utf8
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
    for problem in trace.problems:
        log.warning("%s: %s", result.sandbox_id, problem)
    result.proxy_log_tail = await proxy_log_tail(proxy)
    store, note = await attribution_store(rollout.sandbox)
    result.attribution, unattributed = attribution_check(
        trace.turns, store, note, callers_checked=rollout.sandbox.opencode_isolated
    )
    result.attribution.refused_calls = trace.refused
    result.warnings.extend(attribution_warnings(result.attribution, store_expected=rollout.sandbox.opencode_isolated))
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


def attribution_warnings(check: AttributionCheck, *, store_expected: bool) -> list[str]:
    """What a trainer must hear of: calls refused, and a store that could not be read or contradicts the record
    (attribution never rests on it: the cost is sub-agents' parent labels)."""
    warnings = []
    if check.refused_calls:
        warnings.append(
            f"{check.refused_calls} model calls were refused by the capture proxy (not OpenCode's connection, or no "
            "valid token): never sent to the model, never a turn"
        )
    if store_expected and check.sessions and check.note:
        warnings.append(
            f"OpenCode's session store could not be read ({check.note}): calls are attributed by the proxy's record "
            "alone, sub-agents' parents unknown"
        )
    contradictions = [item for item in check.disagreements if item.startswith("session ")]
    if contradictions:
        warnings.append(
            f"OpenCode's session store contradicts the proxy's record ({len(contradictions)} claims, first: "
            f"{contradictions[0][:300]}): the record stands, the store's claims were ignored"
        )
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
