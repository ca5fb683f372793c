"""The MCP server and its one tool, `run_rollout`: the only implementation of the tool, whichever transport calls it
(the standard MCP endpoints and stdio through FastMCP's protocol handling, OpenEnv's sessions through
`FastMCP.call_tool`).

The tool's input schema is `RolloutRequest`'s own (names, types, bounds, descriptions), so the wire model stays the
one source of truth and `tools/list` documents the tool fully; its output schema is `RolloutResult`'s.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_context
from fastmcp.tools import Tool, ToolResult
from fastmcp.utilities.json_schema import compress_schema
from pydantic import PrivateAttr, ValidationError

from opencode_env.wire import TOOL_NAME, VERSION, Phase, RolloutRequest, RolloutResult, request_problems
from server.rollouts import Rollouts
from server.tool_result import SERVER_NAME, mcp_tool_result

PHASES: tuple[Phase, ...] = ("sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect")
TOOL_DESCRIPTION = (
    "Run one OpenCode coding-agent episode in a fresh sandbox: run the setup commands, the agent on the "
    "instruction, then every verify command. Returns the reward, each LLM turn with per-token logprobs and "
    "token ids (transparent_proxy mode), command results, files, logs and per-phase timings."
)


def invalid_arguments(error: ValidationError) -> str:
    """The caller's mistake in one line, naming each field and its limit."""
    return f"invalid arguments for {TOOL_NAME}: {request_problems(error)}"


class RolloutTool(Tool):
    """`run_rollout`: validates the arguments into a `RolloutRequest`, runs it under the server's cap (progress per
    phase, and per model call during the agent phase, as MCP progress when the caller asked for it) and answers with
    the result whole in the structured content and a summary (or the JSON, `result_text`) as its text."""

    _rollouts: Rollouts = PrivateAttr()

    @classmethod
    def serving(cls, rollouts: Rollouts) -> RolloutTool:
        tool = cls(
            name=TOOL_NAME,
            description=TOOL_DESCRIPTION,
            parameters=compress_schema(RolloutRequest.model_json_schema(), prune_titles=True),
            # Given whole: FastMCP strips titles from the schemas it derives, and ours keeps RolloutResult's name.
            output_schema=RolloutResult.model_json_schema(mode="serialization"),
        )
        tool._rollouts = rollouts
        return tool

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            request = RolloutRequest.model_validate(arguments)
        except ValidationError as error:
            raise ToolError(invalid_arguments(error)) from error
        context = get_context()

        async def progress(phase: Phase, message: str) -> None:
            await context.report_progress(PHASES.index(phase) + 1, len(PHASES), f"{phase}: {message}")

        result = await self._rollouts.run(request, progress)
        # Off the event loop: a result with its token arrays is a few hundred kilobytes to convert.
        return await asyncio.to_thread(mcp_tool_result, result, request.result_text)


def build_mcp(rollouts: Rollouts) -> FastMCP:
    mcp = FastMCP(SERVER_NAME, instructions=TOOL_DESCRIPTION, version=VERSION)
    mcp.add_tool(RolloutTool.serving(rollouts))
    return mcp
