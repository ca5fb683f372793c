"""`/mcp` serves every client nobody here wrote: the official MCP SDK (both handshakes), fastmcp, OpenEnv's
MCPToolClient (WebSocket and its HTTP JSON-RPC), curl-style plain JSON-RPC, and MCP Inspector's CLI (from npm)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastmcp import Client as FastMCPClient
from mcp.client.client import Client as SdkClient
from openenv.core.mcp_client import MCPToolClient

from opencode_env.server.disconnect import PendingReplies
from opencode_env.server.mcp_endpoint import MAX_READ_BODY_BYTES, McpEndpoint
from opencode_env.server.session_quota import SessionQuota
from opencode_env.wire import VERSION
from opencode_env.wire.answer import inline_result
from tests.stub_server import StubServer, stub_arguments, stub_server, wait_until

INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector@0.15.0"
INSPECTOR_2_PACKAGE = "@modelcontextprotocol/inspector@2.12.0"
NODE_22_PACKAGE = "node@22.23.3"


@pytest.fixture(scope="module")
def server() -> Iterator[StubServer]:
    with stub_server(command_s=0.05) as running:
        yield running


def assert_stub_result(data: Any) -> None:
    result = inline_result(data)
    # The stub's agent exits without calling a model, which the pipeline rightly reports as agent_error.
    assert (result.backend, result.status) == ("stub", "agent_error")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("path", ["/mcp", "/mcp/stream"])
async def test_the_official_sdk_initializes_lists_and_calls(server: StubServer, mode: str, path: str) -> None:
    async with SdkClient(f"{server.url}{path}", mode=mode) as client:
        assert client.server_info is not None
        assert (client.server_info.name, client.server_info.version) == ("opencode_env", VERSION)
        tools = (await client.list_tools()).tools
        assert [tool.name for tool in tools] == ["run_rollout"]
        answer = await client.call_tool("run_rollout", stub_arguments())
    assert_stub_result(answer.structured_content)


async def test_fastmcp_over_http_at_mcp(server: StubServer) -> None:
    async with FastMCPClient(f"{server.url}/mcp") as client:
        assert client.server_info is not None
        assert client.server_info.version == VERSION
        answer = await client.call_tool("run_rollout", stub_arguments())
    assert_stub_result(answer.structured_content)


async def test_the_output_schema_is_titled_and_every_field_described(server: StubServer) -> None:
    async with FastMCPClient(f"{server.url}/mcp") as client:
        (tool,) = await client.list_tools()
    schema = tool.output_schema
    assert schema is not None
    assert schema["title"] == "RolloutAnswer"
    undescribed = [name for name, field in schema["properties"].items() if not field.get("description")]
    assert undescribed == []
    assert untyped_items(schema) == []
    assert untyped_items(tool.input_schema) == []


def untyped_items(schema: object, where: str = "") -> list[str]:
    """Where an array's items have an empty schema (the Inspector's --strict warns on each)."""
    found: list[str] = []
    if isinstance(schema, dict):
        if schema.get("items") == {}:
            found.append(where)
        for key, value in schema.items():
            found += untyped_items(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            found += untyped_items(value, f"{where}/{index}")
    return found


async def test_openenv_clients_keep_working_at_mcp(server: StubServer) -> None:
    async with MCPToolClient(base_url=server.url) as env:
        assert [tool.name for tool in await env.list_tools()] == ["run_rollout"]
    production = MCPToolClient(base_url=server.url)
    production.use_production_mode = True
    async with production:
        assert [tool.name for tool in await production.list_tools()] == ["run_rollout"]
    plain = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    plain["params"] = {"name": "run_rollout", "arguments": stub_arguments()}
    async with httpx.AsyncClient(timeout=60) as http:
        answer = (await http.post(f"{server.url}/mcp", json=plain)).json()
    assert_stub_result(answer["result"]["structured_content"])


async def test_invalid_arguments_on_the_plain_json_rpc_path_are_invalid_params(server: StubServer) -> None:
    """JSON-RPC's code for bad arguments (-32602), naming the field and its limit, not an internal error."""
    plain = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    plain["params"] = {"name": "run_rollout", "arguments": {**stub_arguments(), "memory_mb": 1}}
    async with httpx.AsyncClient(timeout=60) as http:
        answer = (await http.post(f"{server.url}/mcp", json=plain)).json()
    assert answer["id"] == 7
    assert answer["error"]["code"] == -32602
    assert "memory_mb: Input should be greater than or equal to 64" in answer["error"]["message"]


async def test_a_one_shot_call_without_a_session_is_served_by_the_standard_transport(server: StubServer) -> None:
    """curl and scripts: one tools/call with the streamable-HTTP headers, no initialize, no session."""
    message = {"jsonrpc": "2.0", "id": 5, "method": "tools/call"}
    message["params"] = {"name": "run_rollout", "arguments": stub_arguments("curl")}
    headers = {"accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=60) as http:
        for path in ("/mcp", "/mcp/stream"):
            response = await http.post(f"{server.url}{path}", json=message, headers=headers)
            assert response.headers["content-type"].startswith("text/event-stream")
            data = next(line[5:] for line in response.text.split("\n") if line.startswith("data:"))
            answer = json.loads(data)
            assert answer["id"] == 5
            assert_stub_result(answer["result"]["structuredContent"])


def test_metadata_names_the_version_backend_and_access(server: StubServer) -> None:
    metadata = httpx.get(f"{server.url}/metadata").json()
    assert metadata["version"] == VERSION
    assert (metadata["backend"], metadata["access"], metadata["max_concurrent_rollouts"]) == (
        "stub",
        "loopback_only",
        4,
    )


def run_inspector(packages: list[str], command: str) -> subprocess.CompletedProcess[str]:
    """Run an MCP Inspector command with npx, which installs the packages from the npm registry first."""
    installs = [arg for package in packages for arg in ("-p", package)]
    return subprocess.run(
        ["npx", "-y", *installs, "-c", command], capture_output=True, text=True, timeout=540, check=False
    )


@pytest.mark.skipif(shutil.which("npx") is None, reason="needs Node's npx")
@pytest.mark.timeout(600)
def test_mcp_inspector_0_15_cli_lists_and_calls_the_tool(server: StubServer) -> None:
    def inspector(*arguments: str) -> Any:
        command = " ".join(["mcp-inspector --cli", f"{server.url}/mcp", "--transport http", *arguments])
        completed = run_inspector([INSPECTOR_PACKAGE], command)
        assert completed.returncode == 0, completed.stdout + completed.stderr
        return json.loads(completed.stdout)

    listed = inspector("--method tools/list")
    assert [tool["name"] for tool in listed["tools"]] == ["run_rollout"]
    fields = stub_arguments("inspector")
    tool_arguments = [f"--tool-arg {name}={value}" for name, value in fields.items() if name != "setup"]
    called = inspector("--method tools/call --tool-name run_rollout", *tool_arguments)
    assert_stub_result(called["structuredContent"])


@pytest.mark.skipif(shutil.which("npx") is None, reason="needs Node's npx")
@pytest.mark.timeout(600)
def test_mcp_inspector_2_on_node_22_lists_the_tool(server: StubServer) -> None:
    """Inspector 2.x needs Node >= 22.19: the npm package `node` provides one for this run only."""
    command = f"node --version && mcp-inspector --cli {server.url}/mcp --transport http --method tools/list"
    completed = run_inspector([NODE_22_PACKAGE, INSPECTOR_2_PACKAGE], command)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    version, _, listing = completed.stdout.partition("\n")
    assert version.startswith("v22.")
    assert [tool["name"] for tool in json.loads(listing)["tools"]] == ["run_rollout"]


async def test_the_text_block_is_a_summary_unless_the_json_is_asked_for(server: StubServer) -> None:
    """A chat model that calls the tool reads the text block: a few lines, not the result's token arrays, then where
    the whole result is; result_text='json' puts a small result's JSON in the text instead."""
    async with FastMCPClient(f"{server.url}/mcp") as client:
        summary = await client.call_tool("run_rollout", stub_arguments("short"))
        whole = await client.call_tool("run_rollout", {**stub_arguments("whole"), "result_text": "json"})
    text, *links = summary.content
    assert text.type == "text"
    assert [link.type for link in links] == ["resource_link", "resource_link"]
    lines = text.text.splitlines()
    assert lines[0] == "task:       short"
    assert lines[1].startswith("status:     agent_error")
    assert "/results/" in lines[-1]
    assert "structuredContent.result" in lines[-1]
    assert len(text.text) < 2_000
    assert_stub_result(summary.structured_content)
    json_text = whole.content[0]
    assert json_text.type == "text"
    assert json.loads(json_text.text) == whole.structured_content["result"]


async def test_a_body_read_at_mcp_is_bounded() -> None:
    endpoint = McpEndpoint(
        standard=refuse,
        stateless=refuse,
        openenv=refuse,
        closing=asyncio.Event(),
        replies=PendingReplies(),
        quota=SessionQuota(1, list),
    )
    chunk = b"x" * 2**20
    parts = [{"type": "http.request", "body": chunk, "more_body": True}] * (MAX_READ_BODY_BYTES // len(chunk) + 2)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return parts.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"content-type", b"application/json")]}
    await endpoint(scope, receive, send)
    assert sent[0]["status"] == 413
    assert len(parts) == 1


async def refuse(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a body over the limit went on")


async def test_mcp_tool_client_s_timeout_leaves_the_rollout_running_until_its_context_exits() -> None:
    """What the docs say happens: MCPToolClient's wait (message_timeout_s) ends in TimeoutError while the rollout
    goes on on the server; leaving the client's context closes its /ws session, and the server cancels the rollout
    and closes its sandbox."""
    with stub_server(command_s=60) as running:
        async with MCPToolClient(base_url=running.url, message_timeout_s=1) as env:
            with pytest.raises(TimeoutError):
                await env.call_tool("run_rollout", **stub_arguments("timed-out"))
            assert await wait_until(lambda: running.backend.created == 1, 30)
            assert running.backend.alive  # the wait ended, the rollout did not
        assert await wait_until(lambda: not running.backend.alive, 60)
