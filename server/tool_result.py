"""A rollout's result in the two forms the server answers with.

Both are built off the event loop by their callers (`asyncio.to_thread`): a result with its turns' token ids and
logprobs is a few hundred kilobytes of JSON. The observation's text is the structured content encoded by orjson:
`python -m bench.answer_encoding` measured it at 0.08x / 0.14x the standard library's `json.dumps` (0.26 against
3.22 ms for a 184 KB result, 1.71 against 12.35 ms for 681 KB; medians of 15 interleaved runs on this 2-core
machine), while for the object itself `model_dump(mode="json")` is as fast as any other way (1.00 / 0.99x).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastmcp.tools import ToolResult
from mcp_types import TextContent

from opencode_env.wire import VERSION, ResultText, RolloutResult, tool_text

SERVER_NAME = "opencode_env"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"


def mcp_tool_result(result: RolloutResult, text: ResultText = "summary") -> ToolResult:
    """For the MCP transports: whole in the structured content, so FastMCP passes it on instead of converting the
    model again; the text block a short summary (a chat model's context is not filled with token arrays) unless the
    caller asked for the JSON."""
    block = result.model_dump_json() if text == "json" else tool_text(result)
    return ToolResult(content=[TextContent(type="text", text=block)], structured_content=result.model_dump(mode="json"))


def session_tool_result(answer: ToolResult) -> dict[str, Any]:
    """For OpenEnv sessions (`/ws`, `/step`): the tool's answer as an observation's `result` carries it, in the
    shape OpenEnv's clients read: `data` the result as a JSON object (as FastMCP's client gives it), and the text
    block the whole result as JSON (programs, not chat models, call here)."""
    text = orjson.dumps(answer.structured_content).decode()
    return {
        "content": [{"type": "text", "text": text, "annotations": None, "meta": None}],
        "structured_content": answer.structured_content,
        "meta": {SERVER_INFO_META: {"name": SERVER_NAME, "version": VERSION}},
        "data": answer.structured_content,
        "is_error": False,
    }
