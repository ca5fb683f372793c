"""One cap on rollouts over every transport: calls beyond it wait for a slot instead of running or being refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastmcp import Client as FastMCPClient
from openenv.core.mcp_client import MCPToolClient

from opencode_env.wire.answer import inline_result
from tests.stub_server import StubServer, stub_arguments, stub_server, wait_until

pytestmark = pytest.mark.timeout(180)
CAP = 4


@pytest.fixture
def server() -> Iterator[StubServer]:
    # Each stub command sleeps 1 s, so ten rollouts overlap unless the cap holds them back.
    with stub_server(command_s=1.0, max_rollouts=CAP) as running:
        yield running


async def through_standard_mcp(url: str, path: str, task_id: str) -> dict[str, Any]:
    async with FastMCPClient(f"{url}{path}", timeout=120) as client:
        answer = await client.call_tool("run_rollout", stub_arguments(task_id))
    assert answer.structured_content is not None
    return answer.structured_content


async def through_openenv_json_rpc(url: str, task_id: str) -> dict[str, Any]:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    message["params"] = {"name": "run_rollout", "arguments": stub_arguments(task_id)}
    async with httpx.AsyncClient(timeout=120) as http:
        data: dict[str, Any] = (await http.post(f"{url}/mcp", json=message)).json()["result"]["structured_content"]
    return data


async def through_websocket(url: str, task_id: str) -> dict[str, Any]:
    async with MCPToolClient(base_url=url, message_timeout_s=120) as env:
        data: dict[str, Any] = await env.call_tool("run_rollout", **stub_arguments(task_id))
    return data


async def through_step(url: str, task_id: str) -> dict[str, Any]:
    action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": stub_arguments(task_id)}
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(f"{url}/step", json={"action": action})
    observation = response.json()["observation"]
    result = observation["result"]
    data: dict[str, Any] = result.get("structured_content") or result.get("data") or result
    return data


async def test_ten_calls_over_every_transport_never_run_more_than_the_cap(server: StubServer) -> None:
    url = server.url
    calls = [
        through_standard_mcp(url, "/mcp", "mcp_0"),
        through_standard_mcp(url, "/mcp", "mcp_1"),
        through_standard_mcp(url, "/mcp/stream", "stream_0"),
        through_standard_mcp(url, "/mcp/stream", "stream_1"),
        through_openenv_json_rpc(url, "shim_0"),
        through_openenv_json_rpc(url, "shim_1"),
        through_websocket(url, "ws_0"),
        through_websocket(url, "ws_1"),
        through_step(url, "step_0"),
        through_step(url, "step_1"),
    ]
    answers = await asyncio.gather(*calls)
    results = [inline_result(answer) for answer in answers]
    assert server.backend.created == 10
    assert server.backend.peak == CAP
    # Every call ran to the stub's usual end (its agent never calls a model), none was refused or timed out.
    assert {result.status for result in results} == {"agent_error"}
    assert sorted(result.task_id for result in results) == sorted(
        ["mcp_0", "mcp_1", "stream_0", "stream_1", "shim_0", "shim_1", "ws_0", "ws_1", "step_0", "step_1"]
    )


async def test_a_call_that_cannot_get_a_slot_within_its_deadline_says_so(server: StubServer) -> None:
    hogs = [asyncio.ensure_future(through_standard_mcp(server.url, "/mcp", f"hog_{i}")) for i in range(CAP)]
    assert await wait_until(lambda: len(server.backend.alive) == CAP, 30)
    impatient = {**stub_arguments("impatient"), "total_timeout_s": 1}
    async with FastMCPClient(f"{server.url}/mcp", timeout=60) as client:
        answer = await client.call_tool("run_rollout", impatient)
    result = inline_result(answer.structured_content)
    assert result.status == "timeout"
    assert result.error is not None
    assert f"{CAP} rollouts run at once" in result.error
    await asyncio.gather(*hogs)
