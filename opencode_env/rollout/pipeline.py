"""The one rollout pipeline: sandbox, install, prepare, setup, proxy, agent, verify, collect; close always.

Failures are recorded in the result (status, failed phase, message) and never raised past `run_rollout`, except
cancellation, which still closes the sandbox before it propagates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from opencode_env.rollout import opencode
from opencode_env.rollout.collect import collect_files, read_tail
from opencode_env.rollout.endpoints import EndpointError, Upstream, resolve_upstream
from opencode_env.rollout.limits import LimitError, sandbox_limits
from opencode_env.rollout.opencode_store import attribution_store
from opencode_env.rollout.proxy_session import (
    ProxyStartError,
    proxy_log_tail,
    read_trace,
    start_proxy,
    stop_proxy,
    wait_healthy,
)
from opencode_env.rollout.reward import read_reward
from opencode_env.rollout.upstream_policy import UpstreamPolicy, key_custody_problem
from opencode_env.rollout.workdir_copy import copy_workdir
from opencode_env.sandbox.base import (
    AGENT_LOG_DIR,
    WORKDIR,
    Identity,
    ProxyHandle,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    task_path,
)
from opencode_env.sandbox.registry import proxy_beside_task_root
from opencode_env.training.attribution import attribution_check
from opencode_env.training.sampling import sampling_warnings
from opencode_env.wire.deadline import Deadline, DeadlineExceeded, total_budget_s
from opencode_env.wire.models import (
    CommandResult,
    Phase,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    RolloutTurn,
    TokenUsage,
    is_infrastructure_failure,
)

log = logging.getLogger("opencode_env.rollout.pipeline")
ProgressCallback = Callable[[Phase, str], Awaitable[None] | None]
T = TypeVar("T")

EVENTS_PATH = f"{AGENT_LOG_DIR}/events.jsonl"
PROGRESS_EVENTS_BYTES = 16 * 1024
AGENT_STDERR_PATH = f"{AGENT_LOG_DIR}/stderr.log"
WORKDIR_COPY_LIMIT = 256 * 2**20
INSTALL_TIMEOUT_S = 600.0
INSTALL_ATTEMPTS = 3
PROXY_START_S = 30.0
CLOSE_TIMEOUT_S = 30.0
VERIFY_COLLECT_RESERVE_S = 10.0
NO_UPSTREAM = Upstream("", "", "", "", disable_thinking=False)


class PhaseFailure(Exception):
    def __init__(self, status: RolloutStatus, phase: Phase, message: str) -> None:
        super().__init__(message)
        self.status: RolloutStatus = status
        self.phase: Phase = phase


@dataclass
class _Rollout:
    request: RolloutRequest
    upstream: Upstream
    sandbox: Sandbox
    result: RolloutResult
    deadline: Deadline
    progress: ProgressCallback | None
    backend: SandboxBackend
    spec: SandboxSpec
    instruction_path: str = ""

    @property
    def workdir(self) -> str:
        return self.spec.workdir

    async def report(self, phase: Phase, message: str) -> None:
        if self.progress is not None:
            outcome = self.progress(phase, message)
            if outcome is not None:
                await outcome

    async def timed(self, phase: Phase, work: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            return await work
        finally:
            setattr(self.result.timings, f"{phase}_s", round(time.monotonic() - started, 4))

    def budget(self, phase: Phase, wanted_s: float) -> float:
        try:
            return self.deadline.budget(wanted_s)
        except DeadlineExceeded as exceeded:
            raise PhaseFailure("timeout", phase, str(exceeded)) from exceeded


async def run_rollout(
    request: RolloutRequest,
    backend: SandboxBackend | None = None,
    *,
    progress: ProgressCallback | None = None,
    result: RolloutResult | None = None,
    upstream_policy: UpstreamPolicy | None = None,
) -> RolloutResult:
    """Run one OpenCode episode and return everything it produced; never raises except on cancellation. A caller
    that may cancel the rollout passes `result` and keeps it: the pipeline fills it as it goes, so after a
    cancellation it still holds everything captured so far, with status `cancelled`. A server passes its
    `upstream_policy`: a base URL its caller chose is then checked before anything starts."""
    if backend is None:
        from opencode_env.sandbox import default_backend

        backend = default_backend()
    started = time.monotonic()
    if result is None:
        result = RolloutResult()
    result.task_id, result.mode, result.backend = request.task_id, request.mode, backend.name
    result.task = request.model_copy(update={"api_key": ""})
    result.warnings = sampling_warnings(result.task)
    result.oracle = request.solution is not None
    try:
        upstream = NO_UPSTREAM if result.oracle else resolve_upstream(request)
        result.upstream = upstream.info()
        if upstream_policy is not None:
            upstream = await _as_a_caller_may(request, upstream, backend, upstream_policy)
        deadline = Deadline(total_budget_s(request))
        endpoints = upstream.host_port() if request.mode == "black_box" else ()
        spec = _sandbox_spec(request, deadline, endpoints)
        sandbox = await _create_sandbox(backend, spec, result, deadline, progress)
        try:
            await _in_sandbox(_Rollout(request, upstream, sandbox, result, deadline, progress, backend, spec))
        finally:
            # Whatever phase ended the rollout (a fork bomb in setup included), before the sandbox is gone.
            result.limits_hit = sandbox.limits_hit()
            await _close(sandbox, result)
    except (EndpointError, LimitError) as error:
        _fail(result, "invalid_request", "validate", str(error))
    except PhaseFailure as failure:
        _fail(result, failure.status, failure.phase, str(failure))
    except SandboxError as error:
        log.warning("the sandbox failed under a rollout: %s", error)
        _fail(result, "sandbox_error", None, str(error))
    except asyncio.CancelledError:
        _fail(result, "cancelled", None, "the rollout was cancelled")
        raise
    except Exception as error:
        log.exception("rollout failed unexpectedly")
        _fail(result, "internal_error", None, f"{type(error).__name__}: {error}")
    finally:
        result.wall_s = round(time.monotonic() - started, 4)
        if is_infrastructure_failure(result.status):
            result.reward, result.reward_source = None, "none"
    return result


def _fail(result: RolloutResult, status: RolloutStatus, phase: Phase | None, message: str) -> None:
    result.status = status
    result.failed_phase = phase
    result.error = message


SANDBOX_USER_IDS = "1000:1000"
"""The agent's tools' uid and gid on every backend."""


def workdir_of(request: RolloutRequest) -> str:
    return request.workdir.rstrip("/") or WORKDIR


async def _as_a_caller_may(
    request: RolloutRequest, upstream: Upstream, backend: SandboxBackend, policy: UpstreamPolicy
) -> Upstream:
    """A server's caller is not its operator: a URL it sends is vetted (the proxy then connects to the address that
    was checked), and the server's key never goes where the caller's root could read it."""
    if upstream.from_caller:
        vetted = await asyncio.to_thread(policy.check, upstream.base_url)
        upstream = replace(upstream, connect_address=vetted)
    shares = proxy_beside_task_root(backend)
    custody = key_custody_problem(request, key_from_server=upstream.key_from_server, proxy_beside_task_root=shares)
    if custody is not None:
        raise EndpointError(custody)
    return upstream


def _sandbox_spec(
    request: RolloutRequest, deadline: Deadline, model_endpoints: tuple[tuple[str, int], ...]
) -> SandboxSpec:
    return SandboxSpec(
        task_id=request.task_id,
        template=request.template or request.image,
        image=request.image,
        workdir=workdir_of(request),
        grader_is_root=request.verify_as == "root",
        lifetime_s=deadline.total_s + 120,
        limits=sandbox_limits(request),
        network=request.network,
        model_endpoints=model_endpoints,
    )


async def _create_sandbox(
    backend: SandboxBackend,
    spec: SandboxSpec,
    result: RolloutResult,
    deadline: Deadline,
    progress: ProgressCallback | None,
) -> Sandbox:
    if progress is not None:
        outcome = progress("sandbox", f"creating a {backend.name} sandbox")
        if outcome is not None:
            await outcome
    started = time.monotonic()
    try:
        sandbox = await asyncio.wait_for(backend.create(spec), timeout=deadline.budget(deadline.remaining()))
    except TimeoutError as error:
        raise PhaseFailure("sandbox_error", "sandbox", "sandbox creation ran out of time") from error
    except SandboxError as error:
        raise PhaseFailure("sandbox_error", "sandbox", str(error)) from error
    finally:
        result.timings.sandbox_s = round(time.monotonic() - started, 4)
    result.sandbox_id = sandbox.sandbox_id
    result.opencode_version = sandbox.tools.opencode_version or ""
    result.enforcement = dict(sandbox.enforcement)
    return sandbox


async def _close(sandbox: Sandbox, result: RolloutResult) -> None:
    started = time.monotonic()
    try:
        await _close_quietly(sandbox)
    finally:
        result.timings.close_s = round(time.monotonic() - started, 4)


async def _in_sandbox(rollout: _Rollout) -> None:
    if rollout.request.solution is not None:
        await _oracle(rollout, rollout.request.solution)
        return
    opencode_path = await rollout.timed("install", _install(rollout))
    await rollout.timed("prepare", _prepare(rollout))
    await rollout.timed("setup", _setup(rollout))
    proxy = await rollout.timed("proxy", _proxy(rollout))
    agent_failure: PhaseFailure | None = None
    collected, proxy_died = False, False
    try:
        try:
            await rollout.timed("agent", _agent(rollout, opencode_path, proxy))
        except PhaseFailure as failure:
            agent_failure = failure
        proxy_died = proxy is not None and not await proxy.running()
        await rollout.timed("verify", _verify(rollout))
        await rollout.timed("collect", _collect(rollout))
        collected = True
    finally:
        if not _cancelling():
            if not collected:
                await _collect_agent_record(rollout)
            if proxy is not None:
                await _collect_turns(rollout, proxy)
    outcome = classify_agent_phase(agent_failure, rollout.result, proxy_died)
    if outcome is not None:
        raise outcome


async def _oracle(rollout: _Rollout, solution: list[str]) -> None:
    """The task's own solution in place of the agent (no model, no proxy, no OpenCode): is the task solvable?"""
    await rollout.timed("prepare", _prepare(rollout))
    await rollout.timed("setup", _setup(rollout))
    timeout_s = rollout.request.agent_timeout_s
    results = await rollout.timed("agent", _run_commands(rollout, "agent", solution, timeout_s, stop_on_failure=True))
    rollout.result.solution_results = results
    rollout.result.agent_exit_code = results[-1].exit_code if results else 0
    await rollout.timed("verify", _verify(rollout))
    await rollout.timed("collect", _collect(rollout))
    if results and results[-1].exit_code != 0:
        failed = results[-1]
        status: RolloutStatus = "agent_timeout" if failed.timed_out else "agent_error"
        why = "timed out" if failed.timed_out else f"exited {failed.exit_code}"
        raise PhaseFailure(status, "agent", f"solution command {len(results)} {why}: {failed.cmd[:200]}")


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _install(rollout: _Rollout) -> str:
    """Install what the sandbox lacks (OpenCode, the proxy's packages); install steps alone are retried."""
    tools = rollout.sandbox.tools
    for step in opencode.install_commands(tools, proxy=rollout.request.mode == "transparent_proxy"):
        await rollout.report("install", step.command)
        await _run_install_step(rollout, step)
    if tools.opencode:
        return tools.opencode
    version = await rollout.sandbox.run("opencode --version", timeout_s=rollout.budget("install", 60))
    if version.exit_code != 0:
        raise PhaseFailure("install_error", "install", f"OpenCode does not run after install: {version.stderr[-500:]}")
    rollout.result.opencode_version = version.stdout.strip().splitlines()[-1] if version.stdout.strip() else ""
    return "opencode"


async def _run_install_step(rollout: _Rollout, step: opencode.InstallStep) -> None:
    command = step.command
    for attempt in range(1, INSTALL_ATTEMPTS + 1):
        result = await rollout.sandbox.run(
            command,
            timeout_s=rollout.budget("install", INSTALL_TIMEOUT_S),
            identity="root" if step.privileged else "user",
        )
        if result.exit_code == 0:
            return
        if attempt == INSTALL_ATTEMPTS:
            raise PhaseFailure(
                "install_error", "install", f"{command!r} failed {INSTALL_ATTEMPTS} times: {result.stderr[-1500:]}"
            )
        log.warning("install step failed (attempt %d), retrying: %s", attempt, result.stderr[-300:])
        await asyncio.sleep(rollout.budget("install", 2.0 * attempt))


async def _prepare(rollout: _Rollout) -> None:
    await rollout.report("prepare", "writing the task files and the instruction")
    if rollout.request.workdir:
        await _hand_workdir_to_user(rollout, recursive=False)
    for path, content in rollout.request.files.items():
        await rollout.sandbox.write_file(task_path(path, rollout.workdir), content)
    rollout.instruction_path = await rollout.sandbox.write_control_file("instruction.md", rollout.request.instruction)


async def _run_commands(
    rollout: _Rollout,
    phase: Phase,
    commands: list[str],
    timeout_s: float,
    stop_on_failure: bool,
    *,
    sandbox: Sandbox | None = None,
    identity: Identity = "user",
) -> list[CommandResult]:
    results: list[CommandResult] = []
    for index, cmd in enumerate(commands, start=1):
        await rollout.report(phase, f"{phase} command {index}/{len(commands)}")
        result = await (sandbox or rollout.sandbox).run(
            cmd,
            timeout_s=rollout.budget(phase, timeout_s),
            env=rollout.request.env,
            cwd=rollout.workdir,
            keep_background=phase == "setup",
            identity=identity,
        )
        results.append(result)
        if stop_on_failure and result.exit_code != 0:
            break
    return results


async def _setup(rollout: _Rollout) -> None:
    request = rollout.request
    identity: Identity = "root" if request.setup_as == "root" else "user"
    results = await _run_commands(
        rollout, "setup", request.setup, request.setup_timeout_s, stop_on_failure=True, identity=identity
    )
    rollout.result.setup_results = results
    if results and results[-1].exit_code != 0:
        failed = results[-1]
        why = "timed out" if failed.timed_out else f"exited {failed.exit_code}"
        raise PhaseFailure("setup_failed", "setup", f"setup command {len(results)} {why}: {failed.cmd[:200]}")
    await _hand_workdir_to_user(rollout, recursive=True)


async def _hand_workdir_to_user(rollout: _Rollout, *, recursive: bool) -> None:
    """The work dir becomes the agent's: made if missing and owned by `user` before setup (so setup and the task's
    files have it), then, as setup (as root) or the image left it, every entry in it (links themselves, never what
    they name)."""
    workdir = shlex.quote(rollout.workdir)
    command = f"mkdir -p -- {workdir} && chown {'-R ' if recursive else ''}-h {SANDBOX_USER_IDS} -- {workdir}"
    handed = await rollout.sandbox.run(
        command, timeout_s=rollout.budget("setup", rollout.request.setup_timeout_s), cwd="/", identity="root"
    )
    if handed.exit_code != 0:
        raise PhaseFailure("setup_failed", "setup", f"could not hand {rollout.workdir} to the agent: {handed.stderr}")


async def _proxy(rollout: _Rollout) -> ProxyHandle | None:
    if rollout.request.mode == "black_box":
        return None
    await rollout.report("proxy", "starting the capture proxy")
    try:
        return await start_proxy(
            rollout.sandbox, rollout.upstream, rollout.request, rollout.budget("proxy", PROXY_START_S)
        )
    except ProxyStartError as error:
        raise PhaseFailure("proxy_error", "proxy", str(error)) from error


def _model_options(rollout: _Rollout) -> dict[str, object]:
    if rollout.request.mode == "black_box" and rollout.upstream.disable_thinking:
        return {"chat_template_kwargs": {"enable_thinking": False}}
    return {}


async def _agent(rollout: _Rollout, opencode_path: str, proxy: ProxyHandle | None) -> None:
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
    )
    config_path = await rollout.sandbox.write_control_file("opencode.json", json.dumps(config, indent=2))
    command = opencode.run_command(
        opencode=opencode_path,
        workdir=rollout.workdir,
        instruction_path=rollout.instruction_path,
        events_path=EVENTS_PATH,
        stderr_path=AGENT_STDERR_PATH,
        title=request.task_id or "rollout",
    )
    env = {**request.env, **opencode.AGENT_ENV, "OPENCODE_CONFIG": config_path, opencode.UPSTREAM_KEY_VAR: agent_key}
    await rollout.report("agent", "running OpenCode")
    timeout_s = rollout.budget("agent", min(request.agent_timeout_s, _after_verify_reserve(rollout)))
    agent = asyncio.ensure_future(rollout.sandbox.run(command, timeout_s=timeout_s, env=env, identity="agent"))
    if proxy is not None:
        await _proxy_healthy_or_stop(rollout, proxy, agent)
        watcher = asyncio.ensure_future(_report_model_calls(rollout, proxy, agent))
        try:
            outcome = await agent
        finally:
            if not agent.done() or agent.cancelled() or _cancelling():
                watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    else:
        outcome = await agent
    rollout.result.agent_exit_code = outcome.exit_code
    if outcome.timed_out:
        raise PhaseFailure("agent_timeout", "agent", f"the agent ran past its {timeout_s:.0f}s limit and was stopped")
    if outcome.exit_code != 0:
        raise PhaseFailure("agent_error", "agent", f"OpenCode exited {outcome.exit_code}")


async def _report_model_calls(rollout: _Rollout, proxy: ProxyHandle, agent: asyncio.Future[CommandResult]) -> None:
    """Progress inside the agent phase: each time the proxy has recorded another model call, how many and how many
    tokens the model sampled so far (read from the proxy's health answer, off its hot path)."""
    reported, every_s = 0, proxy.status_interval_s
    while not agent.done():
        await asyncio.wait({agent}, timeout=every_s)
        health = await proxy.call("/healthz", "GET", 1.0)
        calls = int(health.get("turns_written", 0)) if health else 0
        if calls > reported:
            reported = calls
            tokens = int(health.get("completion_tokens_written", 0)) if health else 0
            text = f"{calls} model call{'s' * (calls != 1)} recorded, {tokens} tokens sampled"
            await rollout.report("agent", text + await _last_tool(rollout.sandbox))


async def _last_tool(sandbox: Sandbox) -> str:
    """The last tool OpenCode reported finished, for progress only (its event stream is the agent's to write)."""
    tools = opencode.parse_events(await read_tail(sandbox, EVENTS_PATH, limit=PROGRESS_EVENTS_BYTES)).tool_calls
    if not tools:
        return ""
    last = tools[-1]
    return f"; last tool: {last.tool[:40]} ({last.title[:60]})" if last.title else f"; last tool: {last.tool[:40]}"


def _after_verify_reserve(rollout: _Rollout) -> float:
    """What the agent may use of the rollout's remaining time once verify and collect have their share set aside
    (at most half of what remains: an agent squeezed to nothing helps no one either)."""
    request = rollout.request
    remaining = rollout.deadline.remaining()
    reserve = min(request.verify_timeout_s * len(request.verify) + VERIFY_COLLECT_RESERVE_S, remaining / 2)
    return max(remaining - reserve, 0.001)


async def _proxy_healthy_or_stop(rollout: _Rollout, proxy: ProxyHandle, agent: asyncio.Future[CommandResult]) -> None:
    """The agent boots while the proxy finishes starting (its socket already listens); a proxy that never becomes
    healthy stops the agent and the rollout."""
    try:
        await wait_healthy(proxy, PROXY_START_S)
    except BaseException as error:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        if isinstance(error, ProxyStartError):
            rollout.result.proxy_log_tail = await proxy_log_tail(proxy)
            raise PhaseFailure("proxy_error", "proxy", str(error)) from error
        raise


async def _verify(rollout: _Rollout) -> None:
    """The reward comes from verify alone, run as the grader: the agent's processes are gone (they died with its
    command), the work dir is handed to the grader and the protected files written in from outside, and verify
    runs with a fresh HOME and /tmp, in this sandbox or a fresh one that holds only a copy of the work dir."""
    if rollout.request.verify_sandbox == "fresh":
        await fresh_verify(rollout)
        return
    await rollout.sandbox.hand_to_grader(rollout.request.verify_files)
    await _grade(rollout, rollout.sandbox)


async def fresh_verify(rollout: _Rollout) -> None:
    """Verify in a new sandbox of the same spec: the task's setup runs there again, then the agent's work dir (as
    the grader packed it) replaces its work dir, then the protected files, then verify. Nothing else of the agent's
    sandbox (HOME, /tmp, processes, planted hooks outside the work dir) exists there."""
    request, result = rollout.request, rollout.result
    await rollout.sandbox.hand_to_grader({})
    await rollout.report("verify", f"creating a fresh {rollout.backend.name} sandbox for verify")
    try:
        fresh = await asyncio.wait_for(
            rollout.backend.create(rollout.spec), timeout=rollout.budget("verify", rollout.deadline.remaining())
        )
    except TimeoutError as error:
        raise PhaseFailure("sandbox_error", "verify", "the fresh verify sandbox ran out of time to start") from error
    except SandboxError as error:
        raise PhaseFailure("sandbox_error", "verify", f"the fresh verify sandbox failed: {error}") from error
    try:
        result.enforcement["verify"] = f"fresh sandbox {fresh.sandbox_id}"
        setup = await _run_commands(rollout, "setup", request.setup, request.setup_timeout_s, True, sandbox=fresh)
        if setup and setup[-1].exit_code != 0:
            raise PhaseFailure("setup_failed", "verify", f"setup failed in the fresh verify sandbox: {setup[-1].cmd}")
        copied = await copy_workdir(
            rollout.sandbox,
            fresh,
            timeout_s=rollout.budget("verify", INSTALL_TIMEOUT_S),
            limit_bytes=WORKDIR_COPY_LIMIT,
            workdir=rollout.workdir,
        )
        if copied.exit_code != 0:
            result.verify_results = [copied]
            result.reward, result.reward_source = 0.0, "verify_pass_rate"
            return
        result.enforcement["verify"] += f", work dir copied in ({copied.stdout}, {copied.duration_s} s)"
        await fresh.hand_to_grader(request.verify_files)
        await _grade(rollout, fresh)
    finally:
        await _close_quietly(fresh)


async def _close_quietly(sandbox: Sandbox) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(sandbox.close())), timeout=CLOSE_TIMEOUT_S)
    except TimeoutError:
        log.error("closing sandbox %s took over %ss", sandbox.sandbox_id, CLOSE_TIMEOUT_S)


async def _grade(rollout: _Rollout, sandbox: Sandbox) -> None:
    request, result = rollout.request, rollout.result
    result.verify_results = await _run_commands(
        rollout, "verify", request.verify, request.verify_timeout_s, False, sandbox=sandbox, identity="grader"
    )
    reward = await read_reward(sandbox, result.verify_results)
    result.reward, result.reward_source = reward.value, reward.source
    if reward.problem:
        log.warning("reward file problem in %s: %s", result.sandbox_id, reward.problem)


async def _collect(rollout: _Rollout) -> None:
    result, sandbox = rollout.result, rollout.sandbox
    await rollout.report("collect", "collecting the files and logs")
    files = await collect_files(sandbox, rollout.workdir)
    result.files, result.files_extra, result.files_non_utf8 = files.text, files.extra, files.non_utf8
    await _collect_agent_record(rollout)


async def _collect_agent_record(rollout: _Rollout) -> None:
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
    result.agent_log_tail = await _agent_log_tail(sandbox, events.errors)


async def _collect_turns(rollout: _Rollout, proxy: ProxyHandle) -> None:
    """Turns and usage come from the proxy's own records, never from a file the sandbox can write."""
    result = rollout.result
    await stop_proxy(proxy)
    trace = await read_trace(proxy)
    result.proxy_turns, result.request_tools = trace.turns, trace.tools
    for problem in trace.problems:
        log.warning("%s: %s", result.sandbox_id, problem)
    result.proxy_log_tail = await proxy_log_tail(proxy)
    store, note = await attribution_store(rollout.sandbox)
    result.attribution, unattributed = attribution_check(trace.turns, store, note)
    if unattributed:
        log.warning("%s: %d model calls OpenCode did not make (kept as unattributed)", result.sandbox_id, unattributed)
    own = [turn for turn in trace.turns if turn.kind != "unattributed"]
    complete = [turn for turn in own if turn.outcome == "complete"]
    result.usage = TokenUsage(
        prompt_tokens=sum(turn.usage.prompt_tokens or 0 for turn in complete),
        completion_tokens=sum(turn.usage.completion_tokens or 0 for turn in complete),
        llm_calls=len(own),
        source="proxy",
    )


def classify_agent_phase(failure: PhaseFailure | None, result: RolloutResult, proxy_died: bool) -> PhaseFailure | None:
    """What the agent phase really ended with, decided from OpenCode's own calls only (a call the proxy could not
    attribute to OpenCode never makes the rollout an infrastructure failure). A rollout that only looks clean (the
    agent exited 0 without ever calling the model) fails; a timeout or crash caused by the model or the proxy says
    so: a deadline that hits while OpenCode retries a failing model is the model's failure, however busy the
    machine was."""
    turns = [turn for turn in result.proxy_turns if turn.kind != "unattributed"]
    if failure is not None and failure.status == "proxy_error":
        return failure
    if proxy_died:
        return PhaseFailure("proxy_error", "agent", "the capture proxy died while the agent ran")
    if failure is None:
        if result.agent_exit_code == 0 and result.usage.llm_calls == 0:
            return PhaseFailure("agent_error", "agent", "OpenCode exited 0 without calling the model")
        return None
    if failure.status not in ("agent_error", "agent_timeout"):
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


async def _agent_log_tail(sandbox: Sandbox, errors: list[str]) -> str:
    parts = [f"opencode error event: {error}" for error in errors[-5:]]
    stderr = await read_tail(sandbox, AGENT_STDERR_PATH)
    if stderr.strip():
        parts.append(stderr)
    log_dir = f"{sandbox.opencode_data_dir}/opencode/log"
    for entry in await sandbox.list_files(log_dir, limit=10):
        parts.append(await read_tail(sandbox, f"{log_dir}/{entry.path}", limit=4096))
    return "\n".join(parts)[-16384:]
