"""The one rollout pipeline: sandbox, install, prepare, setup, proxy, agent, verify, collect; close always.

Failures are recorded in the result (status, failed phase, message) and never raised past `run_rollout`, except
cancellation, which still closes the sandbox before it propagates. The phases live in their own modules:
`commands` (install, prepare, setup), `agent_phase`, `verify_phase`, `collect_phase`; whose fault a failure is,
in `classify`."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from urllib.parse import urlsplit

from pydantic import ValidationError

from opencode_env.rollout.agent_phase import run_agent, start_capture
from opencode_env.rollout.classify import classify_agent_phase
from opencode_env.rollout.collect_phase import collect, collect_agent_record, collect_turns
from opencode_env.rollout.commands import install, prepare, run_commands, setup
from opencode_env.rollout.endpoints import EndpointError, Upstream, resolve_upstream
from opencode_env.rollout.limits import LimitError, sandbox_limits
from opencode_env.rollout.opencode import project_config_removal_command
from opencode_env.rollout.probe import decide, probe_endpoint
from opencode_env.rollout.sampling import non_neutral_fields, sampling_warnings
from opencode_env.rollout.state import PhaseFailure, ProgressCallback, RolloutState, cancelling
from opencode_env.rollout.upstream_policy import UpstreamPolicy, key_custody_problem
from opencode_env.rollout.verify_phase import (
    close_quietly,
    discard_grader_box,
    snapshot_grader_files,
    start_grader_box,
    verify,
)
from opencode_env.sandbox.base import (
    WORKDIR,
    ProxyHandle,
    RolloutSandbox,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
)
from opencode_env.settings import Settings
from opencode_env.training.sequences import trl_row_warning
from opencode_env.wire import (
    Deadline,
    Phase,
    Provenance,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    is_infrastructure_failure,
    total_budget_s,
)

log = logging.getLogger("opencode_env.rollout.pipeline")

NO_UPSTREAM = Upstream("", "", "", "", disable_thinking=False)
SALVAGE_S = 10.0
PROJECT_CONFIG_TIMEOUT_S = 30.0


async def run_rollout(
    request: RolloutRequest,
    backend: SandboxBackend | None = None,
    *,
    progress: ProgressCallback | None = None,
    result: RolloutResult | None = None,
    upstream_policy: UpstreamPolicy | None = None,
    settings: Settings | None = None,
) -> RolloutResult:
    """Run one OpenCode episode and return everything it produced; never raises except on cancellation. A caller
    that may cancel the rollout passes `result` and keeps it: the pipeline fills it as it goes, so after a
    cancellation it still holds everything captured so far, with status `cancelled`. A server passes its
    `upstream_policy`: a base URL its caller chose is then checked before anything starts. `settings` are the
    operator's (named endpoints, the maxima, the operator's network proxy); by default this process's environment's,
    read once here, and a bad one ends the rollout as `invalid_request` naming it."""
    started = time.monotonic()
    result = _begun(request, result or RolloutResult())
    try:
        settings = settings or Settings.load()
    except ValidationError as error:
        _fail(result, "invalid_request", "validate", f"a setting is refused: {error}")
        result.wall_s = round(time.monotonic() - started, 4)
        return result
    if backend is None:
        from opencode_env.sandbox import default_backend

        backend = default_backend(settings)
    result.backend = backend.name
    try:
        upstream = NO_UPSTREAM if result.oracle else resolve_upstream(request, settings)
        result.upstream = upstream.info()
        if upstream_policy is not None:
            upstream = await _as_a_caller_may(request, upstream, backend, upstream_policy)
        if not result.oracle:
            upstream = await _probed(request, upstream, result, settings)
        deadline = Deadline(total_budget_s(request))
        endpoints = upstream.host_port() if request.mode == "black_box" else ()
        spec = _sandbox_spec(request, deadline, endpoints, settings)
        sandbox = await _create_sandbox(backend, spec, result, deadline, progress)
        try:
            await _with_grader_box(
                RolloutState(request, upstream, sandbox, result, deadline, progress, backend, spec, settings)
            )
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
        _fail(result, "cancelled", result.failed_phase, "the rollout was cancelled")
        raise
    except Exception as error:
        log.exception("rollout failed unexpectedly")
        _fail(result, "internal_error", None, f"{type(error).__name__}: {error}")
    finally:
        result.wall_s = round(time.monotonic() - started, 4)
        if is_infrastructure_failure(result.status):
            result.reward, result.reward_source = None, "none"
    if (short := trl_row_warning(result)) is not None:
        result.warnings.append(short)
    return result


def _begun(request: RolloutRequest, result: RolloutResult) -> RolloutResult:
    """The result as it starts: the task it runs (without its key) and what is known before anything runs."""
    result.task_id, result.mode = request.task_id, request.mode
    result.task = request.model_copy(update={"api_key": ""})
    result.warnings = sampling_warnings(result.task)
    result.oracle = request.solution is not None
    return result


def _fail(result: RolloutResult, status: RolloutStatus, phase: Phase | None, message: str) -> None:
    result.status = status
    result.failed_phase = phase
    result.error = message


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
    shares = backend.capabilities.proxy_beside_task_root
    custody = key_custody_problem(request, key_from_server=upstream.key_from_server, proxy_beside_task_root=shares)
    if custody is not None:
        raise EndpointError(custody)
    return upstream


async def _probed(request: RolloutRequest, upstream: Upstream, result: RolloutResult, settings: Settings) -> Upstream:
    """Fail closed before any sandbox: the endpoint's probe (cached) against what the request needs to capture."""
    capture = request.wanted_capture()
    probe = await probe_endpoint(
        upstream,
        top_logprobs=request.top_logprobs,
        proxy=_operator_proxy(upstream, settings),
        token_in=request.token_in != "off",
    )
    result.provenance = Provenance(
        capture=capture,
        endpoint=probe,
        policy_version=request.policy_version,
        policy_version_header=settings.policy_version_header,
    )
    shaped = request.sampling is not None and bool(non_neutral_fields(request.sampling))
    decision = decide(
        probe, capture, top_logprobs=request.top_logprobs, shaped_sampling=shaped, token_in=request.token_in
    )
    result.warnings += decision.warnings
    if decision.refusal is not None:
        raise EndpointError(decision.refusal)
    if not probe.probed:
        return upstream
    found = probe.capabilities
    support = found.token_in
    return replace(
        upstream,
        return_token_ids=found.return_token_ids,
        template_check=probe.template_fingerprint is not None,
        token_in_route="auto" if support is None or support.route == "unknown" else support.route,
        token_in_unavailable=support.problem or "" if support is not None else "",
    )


def _operator_proxy(upstream: Upstream, settings: Settings) -> str:
    host = (urlsplit(upstream.base_url).hostname or "").lower()
    if any(host == entry or host.endswith("." + entry.lstrip(".")) for entry in _listed(settings.no_proxy)):
        return ""
    return settings.https_proxy if upstream.base_url.startswith("https://") else settings.http_proxy


def _listed(text: str) -> list[str]:
    return [entry.strip().lower() for entry in text.split(",") if entry.strip()]


def _sandbox_spec(
    request: RolloutRequest, deadline: Deadline, model_endpoints: tuple[tuple[str, int], ...], settings: Settings
) -> SandboxSpec:
    return SandboxSpec(
        task_id=request.task_id,
        template=request.template or request.image,
        image=request.image,
        workdir=workdir_of(request),
        grader_is_root=request.verify_as == "root",
        lifetime_s=deadline.total_s + 120,
        limits=sandbox_limits(request, settings),
        network=request.network,
        model_endpoints=model_endpoints,
        grader_box="planned" if request.verify_sandbox == "fresh" else "none",
    )


async def _create_sandbox(
    backend: SandboxBackend,
    spec: SandboxSpec,
    result: RolloutResult,
    deadline: Deadline,
    progress: ProgressCallback | None,
) -> RolloutSandbox:
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
        await close_quietly(sandbox)
    finally:
        result.timings.close_s = round(time.monotonic() - started, 4)


async def _with_grader_box(rollout: RolloutState) -> None:
    """The rollout, and the grader's box it may have started closed whatever ended it."""
    try:
        await _in_sandbox(rollout)
    finally:
        await discard_grader_box(rollout)


async def _in_sandbox(rollout: RolloutState) -> None:
    if rollout.request.solution is not None:
        await _oracle(rollout, rollout.request.solution)
        return
    opencode_path = await rollout.timed("install", install(rollout))
    await rollout.timed("prepare", prepare(rollout))
    await rollout.timed("setup", _setup(rollout))
    proxy = await rollout.timed("proxy", start_capture(rollout))
    agent_failure: PhaseFailure | None = None
    collected, proxy_died = False, False
    try:
        try:
            await rollout.timed("agent", run_agent(rollout, opencode_path, proxy))
        except PhaseFailure as failure:
            agent_failure = failure
        proxy_died = proxy is not None and not await proxy.running()
        await rollout.timed("verify", verify(rollout))
        await rollout.timed("collect", collect(rollout))
        collected = True
    finally:
        if not cancelling():
            if not collected:
                await collect_agent_record(rollout)
            if proxy is not None:
                await collect_turns(rollout, proxy)
        elif proxy is not None:
            await _salvage_turns(rollout, proxy)
    outcome = classify_agent_phase(agent_failure, rollout.result, proxy_died)
    if outcome is not None:
        raise outcome


async def _salvage_turns(rollout: RolloutState, proxy: ProxyHandle) -> None:
    """A cancelled rollout still returns the turns the proxy captured before it (a file read, bounded: the caller
    who cancelled is waiting for the sandbox to close)."""
    try:
        await asyncio.wait_for(collect_turns(rollout, proxy), timeout=SALVAGE_S)
    except (TimeoutError, SandboxError) as error:
        rollout.result.warnings.append(f"the turns captured before the cancellation could not be read: {error!r}")


async def _setup(rollout: RolloutState) -> None:
    """The task's setup, then a snapshot of the grader's files as the task left them, then OpenCode's project
    configuration out of the way (OpenCode reads only ours)."""
    await setup(rollout)
    start_grader_box(rollout)
    await snapshot_grader_files(rollout)
    await _remove_opencode_project_config(rollout)


async def _remove_opencode_project_config(rollout: RolloutState) -> None:
    removed = await rollout.sandbox.run(
        project_config_removal_command(rollout.workdir),
        timeout_s=rollout.budget("setup", PROJECT_CONFIG_TIMEOUT_S),
        identity="root",
        cwd="/",
    )
    if removed.exit_code != 0:
        raise PhaseFailure(
            "setup_failed", "setup", f"OpenCode's project configuration could not be removed: {removed.stderr[-500:]}"
        )
    for path in removed.stdout.splitlines():
        rollout.result.warnings.append(
            f"{path}: OpenCode project configuration the task left was removed before the agent ran (OpenCode reads "
            "only the configuration the request declares)"
        )


async def _oracle(rollout: RolloutState, solution: list[str]) -> None:
    """The task's own solution in place of the agent (no model, no proxy, no OpenCode): is the task solvable?"""
    await rollout.timed("prepare", prepare(rollout))
    await rollout.timed("setup", _setup(rollout))
    timeout_s = rollout.request.agent_timeout_s
    results = await rollout.timed("agent", run_commands(rollout, "agent", solution, timeout_s, stop_on_failure=True))
    rollout.result.solution_results = results
    rollout.result.agent_exit_code = results[-1].exit_code if results else 0
    await rollout.timed("verify", verify(rollout))
    await rollout.timed("collect", collect(rollout))
    if results and results[-1].exit_code != 0:
        failed = results[-1]
        status: RolloutStatus = "agent_timeout" if failed.timed_out else "agent_error"
        why = "timed out" if failed.timed_out else f"exited {failed.exit_code}"
        raise PhaseFailure(status, "agent", f"solution command {len(results)} {why}: {failed.cmd[:200]}")
