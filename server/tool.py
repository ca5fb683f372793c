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
from fastmcp.exceptions import ResourceError, ToolError
from fastmcp.server.dependencies import get_context, get_http_request
from fastmcp.tools import Tool, ToolResult
from fastmcp.utilities.json_schema import compress_schema
from pydantic import PrivateAttr, ValidationError

from opencode_env.server.fair_slots import OverShare
from opencode_env.server.gate import caller_of, current_caller
from opencode_env.server.result_store import ResultStore
from opencode_env.server.rollouts import Rollouts
from opencode_env.server.tool_result import SERVER_NAME, mcp_tool_result
from opencode_env.viewer.rows import Caller
from opencode_env.wire import TOOL_NAME, VERSION, Phase, RolloutRequest
from opencode_env.wire.answer import PART_BYTES, RESOURCE_SCHEME, RolloutAnswer
from opencode_env.wire.request import request_problems

PHASES: tuple[Phase, ...] = ("sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect")
TOOL_DESCRIPTION = (
    "Run one OpenCode coding-agent episode in a fresh sandbox: run the setup commands, the agent on the "
    "instruction, then every verify command. Returns the reward, each LLM turn with per-token logprobs and "
    "token ids (transparent_proxy mode), command results, files, logs and per-phase timings: a summary here, "
    "the whole result by reference (an HTTP route and MCP resources; inline too when small)."
)


def invalid_arguments(error: ValidationError) -> str:
    """The caller's mistake in one line, naming each field and its limit."""
    return f"invalid arguments for {TOOL_NAME}: {request_problems(error)}"


class RolloutTool(Tool):
    """`run_rollout`: validates the arguments into a `RolloutRequest`, runs it under the server's cap (progress per
    phase, and per model call during the agent phase, as MCP progress when the caller asked for it) and answers with
    a `RolloutAnswer` in the structured content (the whole result by reference, see wire/answer.py) and a summary
    (or the JSON of a small result, `result_text`) as its text."""

    _rollouts: Rollouts = PrivateAttr()
    _store: ResultStore = PrivateAttr()
    _http: bool = PrivateAttr(default=True)

    @classmethod
    def serving(cls, rollouts: Rollouts, store: ResultStore, *, http: bool = True) -> RolloutTool:
        """`http`: the server has HTTP routes (not over stdio), so the answer names the result's URL."""
        tool = cls(
            name=TOOL_NAME,
            description=TOOL_DESCRIPTION,
            parameters=compress_schema(RolloutRequest.model_json_schema(), prune_titles=True),
            # Given whole: FastMCP strips titles from the schemas it derives, and ours keeps RolloutAnswer's name.
            output_schema=RolloutAnswer.model_json_schema(mode="serialization"),
        )
        tool._rollouts, tool._store, tool._http = rollouts, store, http
        return tool

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            request = RolloutRequest.model_validate(arguments)
        except ValidationError as error:
            raise ToolError(invalid_arguments(error)) from error
        context = get_context()

        async def progress(phase: Phase, message: str) -> None:
            await context.report_progress(PHASES.index(phase) + 1, len(PHASES), f"{phase}: {message}")

        try:
            result = await self._rollouts.run(request, progress, owner=_caller().id)
        except OverShare as over:
            raise ToolError(str(over)) from over
        # Off the event loop: a result with its token arrays is megabytes to encode and compress.
        base_url = _base_url() if self._http else None
        return await asyncio.to_thread(mcp_tool_result, result, self._store, request.result_text, base_url)


def _base_url() -> str:
    """How the caller reached this server (empty outside an HTTP request: OpenEnv's sessions, stdio)."""
    try:
        return str(get_http_request().base_url)
    except RuntimeError:
        return ""


def _caller() -> Caller:
    """Who called: the HTTP request this message came in (the standard transport), else the request this code runs
    for (OpenEnv's sessions, which call the tool from their own connection)."""
    try:
        return caller_of(get_http_request())
    except RuntimeError:
        return current_caller()


def build_mcp(rollouts: Rollouts, store: ResultStore, *, http: bool = True) -> FastMCP:
    mcp = FastMCP(SERVER_NAME, instructions=TOOL_DESCRIPTION, version=VERSION)
    mcp.add_tool(RolloutTool.serving(rollouts, store, http=http))

    @mcp.resource(
        f"{RESOURCE_SCHEME}://results/{{ref}}/{{part}}",
        name="rollout-result-part",
        description="A part of a finished rollout's result, as run_rollout's answer lists them (gzip stream).",
        mime_type="application/gzip",
    )
    def result_part(ref: str, part: int) -> bytes:
        stream = store.gzip_of(ref)
        if stream is None or not 0 <= part * PART_BYTES < max(len(stream), 1):
            raise ResourceError(f"no result part {part} for that id (unknown, expired, or past its last part)")
        return stream[part * PART_BYTES : (part + 1) * PART_BYTES]

    return mcp
