"""Over stdio (`opencode-env mcp`, what desktop clients launch) the server has no HTTP route: its answer names no URL,
and the whole result is read as MCP resources. A real subprocess and a real MCP client; the rollout is one the
endpoint probe refuses at once (its model port is closed), which still answers with a result by reference."""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import sys

from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from mcp.types import BlobResourceContents


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_the_stdio_answer_names_no_url_and_its_resources_hold_the_result() -> None:
    transport = StdioTransport(
        command=sys.executable,
        args=["-m", "opencode_env.cli", "mcp", "--backend", "local"],
        env=dict(os.environ),
    )
    arguments = {"instruction": "x", "base_url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m"}
    async with Client(transport, timeout=120) as client:
        answer = await client.call_tool("run_rollout", arguments, raise_on_error=False)
        assert answer.structured_content is not None
        ref = answer.structured_content["result_ref"]
        parts = [await client.read_resource(uri) for uri in ref["resources"]]
    assert ref["url"] is None
    assert ref["path"].startswith("/results/")
    text = answer.content[0].text  # type: ignore[union-attr]
    assert "GET " not in text
    assert "resources/read" in text
    blobs = [content.blob for [content] in parts if isinstance(content, BlobResourceContents)]
    assert len(blobs) == len(parts)
    result = json.loads(gzip.decompress(b"".join(base64.b64decode(blob) for blob in blobs)))
    assert (result["status"], result["failed_phase"]) == ("upstream_error", "validate")
    assert "refused the connection" in result["error"]
