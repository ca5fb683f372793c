"""The MCP tool `run_rollout` and the OpenEnv environment that serves it.

The tool's parameters are built from `RolloutRequest`'s fields (names, types, bounds, descriptions), so the model
stays the one source of truth and `tools/list` documents the tool fully; its return type is `RolloutResult`, which
FastMCP publishes as the output schema.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Annotated, Any
from uuid import uuid4

from fastmcp import Context, FastMCP
from fastmcp.tools import ToolResult
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field, ValidationError

from opencode_env.sandbox import AUTO, UnknownBackend, default_concurrency, make_backend
from opencode_env.sandbox.base import SandboxBackend
from opencode_env.wire.deadline import total_budget_s
from opencode_env.wire.models import TOOL_NAME, Phase, RolloutRequest, RolloutResult
from opencode_env.wire.version import VERSION
from server.app import SHUTDOWN_GRACE_S
from server.direct_call import call_run_rollout
from server.rollouts import Rollouts
from server.tool_result import SERVER_NAME, mcp_tool_result

log = logging.getLogger("opencode_env.server")
# openenv-core reads FastMCP's renamed Tool.inputSchema on every tools/list; the schema it gets is right.
warnings.filterwarnings("ignore", message="Accessing `Tool.inputSchema` is deprecated")
SERVER_MARGIN_S = 60.0
BACKEND_VAR = "OPENCODE_ENV_BACKEND"
PHASES: tuple[Phase, ...] = ("sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect")
TOOL_DESCRIPTION = (
    "Run one OpenCode coding-agent episode in a fresh sandbox: run the setup commands, the agent on the "
    "instruction, then every verify command. Returns the reward, each LLM turn with per-token logprobs and "
    "token ids (transparent_proxy mode), command results, files, logs and per-phase timings."
)


@dataclass
class Runtime:
    """What every session of this server shares: the sandbox backend, the rollouts under one cap, the MCP server."""

    backend: SandboxBackend
    backend_name: str
    mcp: FastMCP
    rollouts: Rollouts

    async def cancel_in_flight(self, timeout_s: float = SHUTDOWN_GRACE_S) -> None:
        """Cancel every rollout still running (server shutdown) and wait for their sandboxes to close."""
        await self.rollouts.shut_down(timeout_s)
        closed = await self.backend.close_all()
        if closed:
            log.info("shutting down: closed %d sandbox(es) whose rollouts had been torn down", closed)


class _Current:
    """The runtime in use; set by `configure` (tests pass their own backend), else built on first use."""

    runtime: Runtime | None = None


def tool_timeout_s(arguments: dict[str, Any]) -> float:
    """How long the server lets one tool call run: the request's own budget plus a margin."""
    try:
        return total_budget_s(RolloutRequest.model_validate(arguments)) + SERVER_MARGIN_S
    except ValidationError:
        return SERVER_MARGIN_S


def _annotated(base: Any, *metadata: Any) -> Any:
    return Annotated[(base, *metadata)]


def _tool_signature() -> tuple[inspect.Signature, dict[str, Any]]:
    parameters, annotations = [], {}
    for name, info in RolloutRequest.model_fields.items():
        annotation = _annotated(info.annotation, *info.metadata, Field(description=info.description))
        default = inspect.Parameter.empty if info.is_required() else info.get_default(call_default_factory=True)
        parameters.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
        annotations[name] = annotation
    parameters.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Context | None))
    annotations["ctx"] = Context | None
    annotations["return"] = RolloutResult
    return inspect.Signature(parameters, return_annotation=RolloutResult), annotations


def build_mcp(rollouts: Rollouts) -> FastMCP:
    mcp = FastMCP(SERVER_NAME, instructions=TOOL_DESCRIPTION, version=VERSION)

    async def run_rollout_tool(**arguments: Any) -> ToolResult:
        ctx: Context | None = arguments.pop("ctx", None)
        request = RolloutRequest.model_validate(arguments)

        async def progress(phase: Phase, message: str) -> None:
            if ctx is not None:
                await ctx.report_progress(PHASES.index(phase) + 1, len(PHASES), f"{phase}: {message}")

        return await asyncio.to_thread(mcp_tool_result, await rollouts.run(request, progress), request.result_text)

    signature, annotations = _tool_signature()
    run_rollout_tool.__signature__ = signature  # type: ignore[attr-defined]
    run_rollout_tool.__annotations__ = annotations
    run_rollout_tool.__name__ = TOOL_NAME
    # Given explicitly because FastMCP strips titles from the schema it derives; ours keeps RolloutResult's name.
    output_schema = RolloutResult.model_json_schema(mode="serialization")
    mcp.tool(run_rollout_tool, name=TOOL_NAME, description=TOOL_DESCRIPTION, output_schema=output_schema)
    return mcp


def configure(
    backend: SandboxBackend | None = None, backend_name: str | None = None, max_rollouts: int | None = None
) -> Runtime:
    """Set the backend every session uses (by default the one OPENCODE_ENV_BACKEND names, `auto` when unset) and the
    rollout cap; an unknown backend name raises UnknownBackend."""
    if backend is None:
        backend = make_backend(backend_name) if backend_name else backend_from_environment()
    rollouts = Rollouts(backend, max_rollouts or max_concurrent_rollouts(backend))
    _Current.runtime = Runtime(backend, backend.name, build_mcp(rollouts), rollouts)
    log.info(
        "opencode-env %s serving rollouts on the %s backend, at most %d at once", VERSION, backend.name, rollouts.limit
    )
    return _Current.runtime


def runtime() -> Runtime:
    return _Current.runtime if _Current.runtime is not None else configure()


def backend_from_environment() -> SandboxBackend:
    requested = os.environ.get(BACKEND_VAR, AUTO)
    try:
        return make_backend(requested)
    except UnknownBackend as error:
        raise UnknownBackend(requested, named_by=BACKEND_VAR) from error


def max_concurrent_rollouts(backend: SandboxBackend) -> int:
    """The one cap on rollouts running at once, over every transport: MAX_CONCURRENT_ENVS, else the backend's."""
    configured = os.environ.get("MAX_CONCURRENT_ENVS")
    if configured:
        return int(configured)
    return default_concurrency(backend)


def max_sessions(rollout_cap: int) -> int:
    """OpenEnv's WebSocket session limit: above the rollout cap, so that callers beyond it wait for a slot."""
    return max(16, rollout_cap * 4)


class OpenCodeEnvironment(MCPEnvironment):  # type: ignore[misc]
    """One OpenEnv session: the shared `run_rollout` tool, with a time limit that follows each request."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    # One executor thread shared by every session for the little sync work a session does (creating this object,
    # reset, state): otherwise OpenEnv starts a thread per WebSocket session, and the event loop waits for each
    # thread to start (~6 ms per session on a loaded 2-core machine; bench.server_load). Tool calls never use it.
    REQUIRES_SINGLE_THREAD_EXECUTOR = True

    def __init__(self) -> None:
        shared = runtime()
        super().__init__(shared.mcp)
        self._backend_name = shared.backend_name
        self._rollouts = shared.rollouts
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation(done=False, reward=None, metadata={"backend": self._backend_name})

    def _timeout_for(self, action: Action, timeout_s: float | None) -> float | None:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == TOOL_NAME and timeout_s is None:
            return tool_timeout_s(action.arguments)
        return timeout_s

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return await super().step_async(action, timeout_s=self._timeout_for(action, timeout_s), **kwargs)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return super().step(action, timeout_s=self._timeout_for(action, timeout_s), **kwargs)

    async def _async_handle_call_tool(
        self, action: CallToolAction, timeout_s: float | None = None
    ) -> CallToolObservation:
        if action.tool_name != TOOL_NAME:
            return await super()._async_handle_call_tool(action, timeout_s=timeout_s)
        return await call_run_rollout(self._rollouts, action.arguments, timeout_s or tool_timeout_s(action.arguments))

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        name = type(action).__name__
        raise ValueError(f"opencode_env only takes MCP actions (call the {TOOL_NAME} tool), not {name}")

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="opencode_env",
            version=VERSION,
            description=f"OpenCode rollouts with exact token capture; sandbox backend: {self._backend_name}",
        )
