"""`run_rollout` answered straight from an OpenEnv session (`/ws`, `/step`).

OpenEnv's own route for a tool call goes through an in-process MCP client: the MCP server serializes the result two to
three times, and the client then checks it against the output schema with jsonschema (~110 ms of CPU for a 200 KB
result), all on the event loop every session shares. Here the rollout runs under the same cap and cancellation
(`Rollouts.run`) and its result is converted once, off the loop (`server.tool_result`); OpenEnv makes the frame
from the observation. The observation keeps the shape the in-process client gave it: `result` holds `content` (the
result as JSON text), `structured_content` and `data` (the result as a JSON object), `meta` and `is_error`; a
failure is an `error` with its kind.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from openenv.core.env_server.mcp_types import CallToolObservation, ToolError, ToolErrorType
from pydantic import ValidationError

from opencode_env.wire.models import TOOL_NAME, RolloutRequest
from server.rollouts import Rollouts
from server.tool_result import session_tool_result

log = logging.getLogger("opencode_env.server")


async def call_run_rollout(rollouts: Rollouts, arguments: dict[str, Any], timeout_s: float) -> CallToolObservation:
    try:
        request = RolloutRequest.model_validate(arguments)
    except ValidationError as error:
        return _failed(ToolErrorType.INVALID_ARGS, f"invalid arguments for {TOOL_NAME}: {error}")
    try:
        result = await asyncio.wait_for(rollouts.run(request), timeout_s)
    except TimeoutError:
        return _failed(ToolErrorType.TIMEOUT, f"Tool '{TOOL_NAME}' timed out after {timeout_s} seconds")
    except Exception as error:
        log.exception("rollout %s failed inside the server", request.task_id or "-")
        return _failed(ToolErrorType.EXECUTION_ERROR, f"{TOOL_NAME} failed: {error}")
    return CallToolObservation(tool_name=TOOL_NAME, result=await asyncio.to_thread(session_tool_result, result))


def _failed(kind: ToolErrorType, message: str) -> CallToolObservation:
    return CallToolObservation(tool_name=TOOL_NAME, result=None, error=ToolError(error_type=kind, message=message))
