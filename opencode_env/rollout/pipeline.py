"""The one rollout pipeline: sandbox, install, prepare, setup, proxy, agent, verify, collect; close always.

Failures are recorded in the result (status, failed phase, message) and never raised past `run_rollout`, except
cancellation, which still closes the sandbox before it propagates. The phases live in their own modules:
`commands` (install, prepare, setup), `agent_phase`, `verify_phase`, `collect_phase`; whose fault a failure is,
in `classify`."""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from pydantic import ValidationError

from opencode_env.rollout import image_user
from opencode_env.rollout.agent_phase import agent_budget, run_agent, start_capture
from opencode_env.rollout.classify import classify_agent_phase
from opencode_env.rollout.collect_phase import collect, collect_agent_record, collect_turns
from opencode_env.rollout.commands import (
    command_failure,
    hand_workdir_to_user,
    install,
    prepare,
    run_commands,
    setup,
)
from opencode_env.rollout.endpoints import EndpointError, Upstream, resolve_upstream
from opencode_env.rollout.grading import ancestors
from opencode_env.rollout.grading.offline import record_network_failure
from opencode_env.rollout.grading.test_shape import choose_mode
from opencode_env.rollout.limits import LimitError, sandbox_limits
from opencode_env.rollout.opencode import project_config_removal_command
from opencode_env.rollout.preflight.probe import decide, probe_endpoint
from opencode_env.rollout.sampling import non_neutral_fields, sampling_notices
from opencode_env.rollout.state import (
    EVENTS_PATH,
    EpisodeEnd,
    PhaseFailure,
    ProgressCallback,
    RolloutState,
    cancelling,
)
from opencode_env.rollout.steps import close_turn_ranges, run_steps
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
    Identity,
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
    PhaseIdentity,
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
DRAIN_S = 30.0


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
    await _known_before(request, result, backend)
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
        record_network_failure(result, request.network)
        _warn_after(result)  # a cancelled rollout's partial result too
    return result


def _warn_after(result: RolloutResult) -> None:
    """The warnings that depend on the whole rollout (what it sampled, its TRL row), then all most serious first."""
    endpoint = result.provenance.endpoint if result.provenance is not None else None
    kind = endpoint.capabilities.logprobs_kind if endpoint is not None and endpoint.probed else None
    for notice in sampling_notices(result.task, sampled=bool(result.proxy_turns), logprobs_kind=kind):
        result.warn(notice.code, notice.message, severity=notice.severity, fix=notice.fix)
    if (short := trl_row_warning(result)) is not None:
        result.warn("trl_row_short", short, fix=short.partition(". Fix: ")[2])
    result.order_warnings()


def _begun(request: RolloutRequest, result: RolloutResult) -> RolloutResult:
    """The result as it starts: the task it runs (without its key) and what is known before anything runs."""
    result.task_id, result.mode = request.task_id, request.mode
    result.task = request.model_copy(update={"api_key": ""})
    result.oracle = request.solution is not None
    result.identities = _identities(request)
    return result


async def _known_before(request: RolloutRequest, result: RolloutResult, backend: SandboxBackend) -> None:
    """The backend, and the test grader's mode, from the task's tests alone, before anything runs (choose_mode is
    total; off the loop: it parses them)."""
    result.backend = backend.name
    if request.tests is not None:
        choice = await asyncio.to_thread(choose_mode, request.tests)
        result.test_mode, result.test_mode_reason = choice.mode, choice.reason


def _identities(request: RolloutRequest) -> dict[Phase, PhaseIdentity]:
    """Who each phase's task commands run as (the pipeline passes the same to the sandbox)."""
    identities: dict[Phase, PhaseIdentity] = {}
    if request.setup or any(step.setup for step in request.steps):
        identities["setup"] = request.setup_as
    identities["agent"] = request.solution_as if request.solution is not None else "user"
    identities["verify"] = "root" if request.verify_as == "root" else "grader"
    return identities


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
    for notice in decision.warnings:
        result.warn(notice.code, notice.message, severity=notice.severity, fix=notice.fix)
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
        services=tuple(request.services),
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
    if spec.services and not backend.capabilities.runs_services:
        raise PhaseFailure(
            "sandbox_error",
            "sandbox",
            f"services: the {backend.name} backend runs one sandbox per rollout, not sidecars (a docker-compose "
            "environment runs on the local backend; docs/tasks.md)",
        )
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
    """One episode (setup, the agent or the oracle, verify), or one per step of a multi-step task (steps.py), then
    collect; the turns are collected whatever ended it, and the agent phase's outcome decided from them."""
    oracle = rollout.request.solution is not None
    opencode_path = "" if oracle else await rollout.timed("install", install(rollout))
    capture = Capture(per_step=bool(rollout.request.steps))

    async def episode(view: RolloutState) -> EpisodeEnd:
        if view.request.solution is not None:
            return await _oracle(view, view.request.solution)
        return await _agent_episode(view, opencode_path, capture)

    end: EpisodeEnd | None = None
    collected = False
    try:
        end = await (run_steps(rollout, episode) if rollout.request.steps else episode(rollout))
        await rollout.timed("collect", collect(rollout))
        collected = True
    finally:
        if not cancelling():
            if capture.started and not collected:
                await collect_agent_record(rollout)
            if capture.proxy is not None:
                await collect_turns(rollout, capture.proxy)
        elif capture.proxy is not None:
            await _salvage_turns(rollout, capture.proxy)
        close_turn_ranges(rollout.result)
    if end is None:
        return
    outcome = end.failure if oracle else classify_agent_phase(end.failure, rollout.result, end.proxy_died)
    if outcome is not None:
        raise outcome


@dataclass
class Capture:
    """The capture proxy of a rollout's episodes: started once, after the first episode's setup."""

    proxy: ProxyHandle | None = None
    started: bool = False
    per_step: bool = False
    """Drained after each agent run, so each step's turns are told apart."""


async def _agent_episode(rollout: RolloutState, opencode_path: str, capture: Capture) -> EpisodeEnd:
    await rollout.timed("prepare", prepare(rollout))
    await rollout.timed("setup", _setup(rollout))
    if not capture.started:
        capture.proxy = await rollout.timed("proxy", start_capture(rollout))
        capture.started = True
    proxy = capture.proxy
    agent_failure: PhaseFailure | None = None
    try:
        await rollout.timed("agent", run_agent(rollout, opencode_path, proxy))
    except PhaseFailure as failure:
        agent_failure = failure
    finally:
        await rollout.sandbox.resume_services()
    proxy_died = proxy is not None and not await proxy.running()
    turns = await _drained(proxy) if capture.per_step and not proxy_died else None
    await _services_checked(rollout)
    await rollout.timed("verify", verify(rollout))
    return EpisodeEnd(agent_failure, proxy_died, turns)


async def _drained(proxy: ProxyHandle | None) -> int | None:
    """The turns the proxy has written once every call the agent made has ended (a step's last turn index)."""
    if proxy is None:
        return None
    answer = await proxy.call("/drain", "POST", DRAIN_S)
    return int(answer["turns_written"]) if answer and isinstance(answer.get("turns_written"), int) else None


async def _salvage_turns(rollout: RolloutState, proxy: ProxyHandle) -> None:
    """A cancelled rollout still returns the turns the proxy captured before it (a file read, bounded: the caller
    who cancelled is waiting for the sandbox to close)."""
    try:
        await asyncio.wait_for(collect_turns(rollout, proxy), timeout=SALVAGE_S)
    except (TimeoutError, SandboxError) as error:
        message = f"the turns captured before the cancellation could not be read: {error!r}"
        rollout.result.warn("turns_unread", message, severity="error")


async def _setup(rollout: RolloutState) -> None:
    """The task's setup, then (where a sandbox costs nothing while it waits) the grader's box started beside the
    agent, then a snapshot of the grader's files as the task left them, then OpenCode's project configuration out of
    the way (OpenCode reads only ours). Setup's services are frozen before the removal and stay frozen until OpenCode
    has read its configuration (run_agent thaws them), so none can plant it again."""
    await setup(rollout)
    if not rollout.backend.capabilities.grader_box_at_agent_end:
        start_grader_box(rollout)
    await snapshot_grader_files(rollout)
    await ancestors.snapshot(rollout)
    await rollout.sandbox.pause_services()
    await _remove_opencode_project_config(rollout)


async def _remove_opencode_project_config(rollout: RolloutState) -> None:
    # OpenCode's event stream goes too: without a proxy, its first byte is what thaws setup's services.
    removed = await rollout.sandbox.run(
        f"{project_config_removal_command(rollout.workdir)} && rm -rf -- {shlex.quote(EVENTS_PATH)}",
        timeout_s=rollout.budget("setup", PROJECT_CONFIG_TIMEOUT_S),
        identity="root",
        cwd="/",
    )
    if removed.timed_out and rollout.after_agent:
        raise PhaseFailure(
            "agent_error",
            "setup",
            f"what the earlier steps' agent left where OpenCode reads its project configuration (the work dir and the "
            f"directories above it) could not be removed in {removed.duration_s:.0f} s",
        )
    if removed.timed_out:
        raise PhaseFailure(
            "sandbox_error",
            "setup",
            f"our removal of OpenCode's project configuration did not finish in {removed.duration_s:.0f} s (our step, "
            "not the task's: the machine may be overloaded)",
        )
    if removed.exit_code != 0:
        raise PhaseFailure(
            "setup_failed", "setup", f"OpenCode's project configuration could not be removed: {removed.stderr[-500:]}"
        )
    for path in removed.stdout.splitlines():
        message = (
            f"{path}: OpenCode project configuration the task left was removed before the agent ran (OpenCode reads "
            "only the configuration the request declares)"
        )
        rollout.result.warn("project_config_removed", message, severity="note")


async def _services_checked(rollout: RolloutState) -> None:
    """A sidecar that died before verify left its port to whoever bound it next (the agent shares its loopback): a
    grade that talked to that port may have talked to the agent."""
    if not rollout.request.services:
        return
    if down := await rollout.sandbox.services_down():
        message = (
            f"services {', '.join(down)} exited before verify: their ports were free for the agent to bind, so a "
            "verify that talked to them may have talked to the agent"
        )
        rollout.result.warn("service_down", message, severity="error", fix="keep the services up (check their logs)")


async def _oracle(rollout: RolloutState, solution: list[str]) -> EpisodeEnd:
    """The task's own solution in place of the agent (no model, no proxy, no OpenCode): is the task solvable?"""
    await rollout.timed("prepare", prepare(rollout))
    await rollout.timed("setup", _setup(rollout))
    await rollout.sandbox.resume_services()
    timeout_s = agent_budget(rollout)
    identity: Identity = "user" if rollout.request.solution_as == "user" else "root"
    if rollout.request.solution_as == "image_user" and rollout.request.image_user is not None:
        user = rollout.request.image_user
        await hand_workdir_to_user(rollout, recursive=True, owner=image_user.owner(user))
        solution = [image_user.as_image_user(user, command) for command in solution]
    solving = run_commands(rollout, "agent", solution, timeout_s, stop_on_failure=True, identity=identity)
    results = await rollout.timed("agent", solving)
    rollout.result.solution_results = results
    rollout.result.agent_exit_code = results[-1].exit_code if results else 0
    await _services_checked(rollout)
    await rollout.timed("verify", verify(rollout))
    if results and results[-1].exit_code != 0:
        failed = results[-1]
        status: RolloutStatus = "agent_timeout" if failed.timed_out else "agent_error"
        return EpisodeEnd(PhaseFailure(status, "agent", command_failure("solution command", results, rollout.workdir)))
    return EpisodeEnd()
