"""The capture proxy and the agent phase: OpenCode's config, its run under what is left of the deadline (verify's
share set aside), the proxy's health, and progress per model call while it runs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from opencode_env.rollout import opencode
from opencode_env.rollout.collect import read_tail
from opencode_env.rollout.grading import grader_box
from opencode_env.rollout.proxy_session import (
    ProxyStartError,
    proxy_log_tail,
    start_proxy,
    wait_healthy,
)
from opencode_env.rollout.skills import give_skills
from opencode_env.rollout.state import AGENT_STDERR_PATH, EVENTS_PATH, PhaseFailure, RolloutState, cancelling
from opencode_env.sandbox.base import (
    ProxyHandle,
    Sandbox,
)
from opencode_env.wire import (
    CommandResult,
)

log = logging.getLogger("opencode_env.rollout.agent_phase")

PROGRESS_EVENTS_BYTES = 16 * 1024
PROXY_START_S = 120.0
"""How long the proxy may take to listen: a start that fails ends at once, so this bounds only a slow one, and a
machine at load ~15 took over 20 s to start the proxy's Python."""
VERIFY_COLLECT_RESERVE_S = 10.0
THAW_POLL_S = 0.2


async def start_capture(rollout: RolloutState) -> ProxyHandle | None:
    if rollout.request.mode == "black_box":
        return None
    await rollout.report("proxy", "starting the capture proxy")
    try:
        return await start_proxy(
            rollout.sandbox,
            rollout.upstream,
            rollout.request,
            rollout.settings,
            rollout.budget("proxy", PROXY_START_S),
        )
    except ProxyStartError as error:
        raise PhaseFailure("proxy_error", "proxy", str(error)) from error


def _model_options(rollout: RolloutState) -> dict[str, object]:
    if rollout.request.mode == "black_box" and rollout.upstream.disable_thinking:
        return {"chat_template_kwargs": {"enable_thinking": False}}
    return {}


async def run_agent(rollout: RolloutState, opencode_path: str, proxy: ProxyHandle | None) -> None:
    request, upstream = rollout.request, rollout.upstream
    if proxy is None:
        base_url, model_id, agent_key = upstream.base_url, upstream.model, upstream.api_key
    else:
        base_url, model_id, agent_key = proxy.base_url, opencode.PROXY_MODEL_ALIAS, proxy.token
    config = opencode.render_config(
        base_url=base_url,
        model_id=model_id,
        max_tokens_cap=request.max_tokens_cap,
        model_options=_model_options(rollout),
        sub_agents=request.sub_agents,
        store_dir=rollout.sandbox.opencode_data_dir,
        skills_dir=await give_skills(rollout),
        mcp_servers=request.mcp_servers,
    )
    rollout.opencode_config = config
    config_path = await rollout.sandbox.write_control_file("opencode.json", opencode.config_text(config))
    command = opencode.run_command(
        opencode=opencode_path,
        workdir=rollout.workdir,
        instruction_path=rollout.instruction_path,
        events_path=EVENTS_PATH,
        stderr_path=AGENT_STDERR_PATH,
        title=request.task_id or "rollout",
    )
    env = {**request.env, **opencode.AGENT_ENV, "OPENCODE_CONFIG": config_path, opencode.MODEL_KEY_ENV_NAME: agent_key}
    await rollout.report("agent", "running OpenCode")
    timeout_s = agent_budget(rollout)
    agent = asyncio.ensure_future(rollout.sandbox.run(command, timeout_s=timeout_s, env=env, identity="agent"))
    thaw = asyncio.ensure_future(_thaw_services_once_configured(rollout, proxy, agent))
    try:
        outcome = await _await_agent(rollout, proxy, agent, timeout_s)
    finally:
        thaw.cancel()
        await asyncio.gather(thaw, return_exceptions=True)
    rollout.result.agent_exit_code = outcome.exit_code
    if outcome.timed_out:
        raise PhaseFailure("agent_timeout", "agent", f"the agent ran past its {timeout_s:.0f}s limit and was stopped")
    if outcome.exit_code != 0:
        raise PhaseFailure("agent_error", "agent", f"OpenCode exited {outcome.exit_code}")


async def _thaw_services_once_configured(
    rollout: RolloutState, proxy: ProxyHandle | None, agent: asyncio.Future[CommandResult]
) -> None:
    """Setup's services (frozen since before the project configuration was removed) thaw once OpenCode has loaded
    its configuration, plugins, agents and tools: it does so before its first model call, so the first call the
    proxy answered in this agent's run (without a proxy: the first event OpenCode wrote) marks the point. The
    agent's first tool runs after that call, so the services are back before the agent can use them."""
    while not agent.done():
        await asyncio.wait({agent}, timeout=THAW_POLL_S)
        if proxy is not None:
            health = await proxy.call("/healthz", "GET", 1.0)
            if health and int(health.get("turns_written", 0)) > rollout.turns_before:
                break
        elif await read_tail(rollout.sandbox, EVENTS_PATH, limit=1):
            break
    await rollout.sandbox.resume_services()


async def _await_agent(
    rollout: RolloutState, proxy: ProxyHandle | None, agent: asyncio.Future[CommandResult], timeout_s: float
) -> CommandResult:
    if proxy is not None:
        await _proxy_healthy_or_stop(rollout, proxy, agent, timeout_s)
        watcher = asyncio.ensure_future(_watch_proxy(rollout, proxy, agent))
        try:
            running: set[asyncio.Future[Any]] = {agent, watcher}
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            if not agent.done() and watcher.done() and not watcher.cancelled() and watcher.exception() is None:
                agent.cancel()
                await asyncio.gather(agent, return_exceptions=True)
                raise PhaseFailure(
                    "proxy_error", "agent", "the capture proxy died while the agent ran: the agent was stopped then"
                )
            return await agent
        finally:
            if not agent.done() or agent.cancelled() or cancelling():
                watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    return await agent


async def _watch_proxy(rollout: RolloutState, proxy: ProxyHandle, agent: asyncio.Future[CommandResult]) -> None:
    """Progress inside the agent phase: each time the proxy has recorded another model call, how many and how many
    tokens the model sampled so far (read from the proxy's health answer, off its hot path). Returns before the
    agent is done only when the proxy has exited: from then on every call of the agent's can only fail, and the
    agent would otherwise wait out its whole budget retrying them."""
    reported, tool, every_s = 0, "", proxy.status_interval_s
    while not agent.done():
        await asyncio.wait({agent}, timeout=every_s)
        health = await proxy.call("/healthz", "GET", 1.0)
        if health is None and not agent.done() and not await proxy.running():
            return
        calls = int(health.get("turns_written", 0)) if health else 0
        # OpenCode may write a tool's end to its event stream after it sent the next call: until a report names a
        # tool, each poll looks again, and the first tool seen is reported with the same count.
        if calls > reported or (calls and not tool):
            latest = await _last_tool(rollout.sandbox)
            if calls > reported or latest:
                reported, tool = calls, latest
                tokens = int(health.get("completion_tokens_written", 0)) if health else 0
                text = f"{calls} model call{'s' * (calls != 1)} recorded, {tokens} tokens sampled"
                await rollout.report("agent", text + latest)


async def _last_tool(sandbox: Sandbox) -> str:
    """The last tool OpenCode reported finished, for progress only (its event stream is the agent's to write)."""
    tools = opencode.parse_events(await read_tail(sandbox, EVENTS_PATH, limit=PROGRESS_EVENTS_BYTES)).tool_calls
    if not tools:
        return ""
    last = tools[-1]
    return f"; last tool: {last.tool[:40]} ({last.title[:60]})" if last.title else f"; last tool: {last.tool[:40]}"


def agent_budget(rollout: RolloutState) -> float:
    """The agent's (or the oracle's) time: its own timeout, within what the deadline leaves once verify's share is set
    aside."""
    return rollout.budget("agent", min(rollout.request.agent_timeout_s, _after_verify_reserve(rollout)))


def _after_verify_reserve(rollout: RolloutState) -> float:
    """What the agent may use of the rollout's remaining time once verify and collect have their share set aside:
    every verify command's timeout (and the graded tests' run), the grader's box's start where verify waits for it,
    and a margin; at most half of what remains (an agent squeezed to nothing helps no one either). A verify the
    deadline still cuts short ends the rollout as a timeout, with no grade (commands.raise_if_cut)."""
    request = rollout.request
    remaining = rollout.deadline.remaining()
    runs = len(request.verify) + (request.tests is not None)
    wanted = request.verify_timeout_s * runs + grader_box.start_cost_s(rollout) + VERIFY_COLLECT_RESERVE_S
    reserve = min(wanted, remaining / 2)
    return max(remaining - reserve, 0.001)


async def _proxy_healthy_or_stop(
    rollout: RolloutState, proxy: ProxyHandle, agent: asyncio.Future[CommandResult], budget_s: float
) -> None:
    """The agent boots while the proxy finishes starting (its socket already listens), within the agent's budget (the
    agent can do nothing without it); a proxy that exits, or never becomes healthy in that time, stops the agent
    and the rollout."""
    try:
        await wait_healthy(proxy, budget_s)
    except BaseException as error:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        if isinstance(error, ProxyStartError):
            rollout.result.proxy_log_tail = await proxy_log_tail(proxy)
            raise PhaseFailure("proxy_error", "proxy", str(error)) from error
        raise
