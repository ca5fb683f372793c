"""OpenEnv's side of the server: one `OpenCodeEnvironment` per OpenEnv session (`/ws`, `/mcp` over WebSocket,
`/reset`, `/step`, and OpenEnv's JSON-RPC at `/mcp`), made by OpenEnv's `create_app` from a partial of this class
bound to the server's runtime.

A `run_rollout` action is answered as over MCP (a small `RolloutAnswer`, the whole result by reference: see
`server.tool_result.session_tool_result`) by the one tool, called through FastMCP's public `call_tool` rather than
through
OpenEnv's in-process MCP client, which would serialise the result two to three more times and check it against the
output schema on the event loop every session shares (~110 ms of CPU for a 200 KB result); and under a time limit
that follows the request's own budget instead of OpenEnv's 30 s default for a tool call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from fastmcp.exceptions import NotFoundError, ToolError
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.mcp_types import ToolError as ObservedError
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import ValidationError

from opencode_env.server.fair_slots import OverShare
from opencode_env.server.tool import TOOL_DESCRIPTION
from opencode_env.server.tool_result import session_tool_result
from opencode_env.wire import TOOL_NAME, VERSION, RolloutRequest, total_budget_s

log = logging.getLogger("opencode_env.server")
SERVER_MARGIN_S = 60.0
ENV_NAME = "opencode_env"


def tool_timeout_s(arguments: dict[str, Any]) -> float:
    """How long the server lets one tool call run: the request's own budget plus a margin."""
    try:
        return total_budget_s(RolloutRequest.model_validate(arguments)) + SERVER_MARGIN_S
    except ValidationError:
        return SERVER_MARGIN_S


def max_sessions(rollout_cap: int) -> int:
    """OpenEnv's WebSocket session limit: above the rollout cap, so that callers beyond it wait for a slot."""
    return max(16, rollout_cap * 4)


def metadata(backend_name: str) -> EnvironmentMetadata:
    return EnvironmentMetadata(
        name=ENV_NAME,
        version=VERSION,
        description=f"{TOOL_DESCRIPTION} Sandbox backend: {backend_name}.",
    )


class OpenCodeEnvironment(MCPEnvironment):  # type: ignore[misc]
    """One OpenEnv session over the server's MCP server."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    # One executor thread shared by every session for the little sync work a session does (creating this object,
    # reset, state): otherwise OpenEnv starts a thread per WebSocket session, and the event loop waits for each
    # thread to start (~6 ms per session on a loaded 2-core machine; bench.server_load). Tool calls never use it.
    REQUIRES_SINGLE_THREAD_EXECUTOR = True

    def __init__(self, mcp: FastMCP, backend_name: str) -> None:
        super().__init__(mcp)
        self._backend_name = backend_name
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation(done=False, reward=None, metadata={"backend": self._backend_name})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == TOOL_NAME:
            return await self._run_rollout(action.arguments, timeout_s or tool_timeout_s(action.arguments))
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if isinstance(action, CallToolAction) and action.tool_name == TOOL_NAME and timeout_s is None:
            timeout_s = tool_timeout_s(action.arguments)
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def _run_rollout(self, arguments: dict[str, Any], timeout_s: float) -> CallToolObservation:
        try:
            answer = await asyncio.wait_for(self.mcp_server.call_tool(TOOL_NAME, arguments), timeout_s)
        except TimeoutError:
            return _failed("timeout", f"Tool '{TOOL_NAME}' timed out after {timeout_s} seconds")
        except ToolError as error:
            refused = isinstance(error.__cause__, OverShare)
            return _failed("execution_error" if refused else "invalid_args", str(error))
        except NotFoundError as error:
            return _failed("tool_not_found", str(error))
        except Exception as error:
            log.exception("run_rollout failed inside the server")
            return _failed("execution_error", f"{TOOL_NAME} failed: {error}")
        return CallToolObservation(tool_name=TOOL_NAME, result=session_tool_result(answer))

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        name = type(action).__name__
        raise ValueError(f"opencode_env only takes MCP actions (call the {TOOL_NAME} tool), not {name}")

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return metadata(self._backend_name)


def _failed(kind: str, message: str) -> CallToolObservation:
    return CallToolObservation(tool_name=TOOL_NAME, result=None, error=ObservedError(error_type=kind, message=message))
