"""`run_rollout` answered straight from an OpenEnv session (`/ws`, `/step`).

OpenEnv's own route for a tool call goes through an in-process MCP client: the MCP server serializes the result two to
three times, and the client then checks it against the output schema with jsonschema (~110 ms of CPU for a 200 KB
result), all on the event loop every session shares. Here the rollout runs under the same cap and cancellation
(`Rollouts.run`) and its result is serialized once, off the loop. The observation keeps the shape the in-process
client gave it: `result` holds `content` (the result as JSON text), `structured_content` and `data` (the result as a
JSON object), `meta` and `is_error`; a failure is an `error` with its kind.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from openenv.core.env_server.mcp_types import CallToolObservation, ToolError, ToolErrorType
from pydantic import ValidationError

from opencode_env.models import TOOL_NAME, RolloutRequest, RolloutResult
from opencode_env.version import VERSION
from server.rollouts import Rollouts

log = logging.getLogger("opencode_env.server")
SERVER_NAME = "opencode_env"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"


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
    return CallToolObservation(tool_name=TOOL_NAME, result=await asyncio.to_thread(tool_result, result))


def tool_result(result: RolloutResult) -> dict[str, Any]:
    """The MCP tool result of a rollout, as the session's observation carries it."""
    as_json = result.model_dump(mode="json")
    return {
        "content": [{"type": "text", "text": result.model_dump_json(), "annotations": None, "meta": None}],
        "structured_content": as_json,
        "meta": {SERVER_INFO_META: {"name": SERVER_NAME, "version": VERSION}},
        "data": as_json,
        "is_error": False,
    }


def _failed(kind: ToolErrorType, message: str) -> CallToolObservation:
    return CallToolObservation(tool_name=TOOL_NAME, result=None, error=ToolError(error_type=kind, message=message))
