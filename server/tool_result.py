"""A rollout's result in the two forms the server answers with.

Both are built off the event loop by their callers (`asyncio.to_thread`): a result with its turns' token ids and
logprobs is a few hundred kilobytes of JSON, and converting it costs milliseconds of CPU that every other caller of
the server would otherwise wait behind.
"""

from __future__ import annotations

from typing import Any

from fastmcp.tools import ToolResult
from mcp_types import TextContent

from opencode_env.wire.models import ResultText, RolloutResult
from opencode_env.wire.summary import tool_text
from opencode_env.wire.version import VERSION

SERVER_NAME = "opencode_env"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"


def mcp_tool_result(result: RolloutResult, text: ResultText = "summary") -> ToolResult:
    """For the MCP transports: whole in the structured content, so FastMCP passes it on instead of converting the
    model again; the text block a short summary (a chat model's context is not filled with token arrays) unless the
    caller asked for the JSON."""
    block = result.model_dump_json() if text == "json" else tool_text(result)
    return ToolResult(content=[TextContent(type="text", text=block)], structured_content=result.model_dump(mode="json"))


def session_tool_result(result: RolloutResult) -> dict[str, Any]:
    """For OpenEnv sessions (`/ws`, `/step`): the MCP tool result as an observation's `result` carries it, in the
    shape OpenEnv's clients read (the text block the whole result as JSON: programs, not chat models, call here)."""
    as_json = result.model_dump(mode="json")
    return {
        "content": [{"type": "text", "text": result.model_dump_json(), "annotations": None, "meta": None}],
        "structured_content": as_json,
        "meta": {SERVER_INFO_META: {"name": SERVER_NAME, "version": VERSION}},
        "data": as_json,
        "is_error": False,
    }
