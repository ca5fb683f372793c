"""`run_rollout` over OpenEnv's WebSocket is answered by the one tool through FastMCP's `call_tool`, not through an
in-process MCP client: the observation carries the standard MCP answer once, in the shape OpenEnv's clients read,
and the whole result by reference."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastmcp import Client
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from websockets.asyncio.client import connect

from opencode_env.client.by_reference import fetch_result
from opencode_env.server.environment import OpenCodeEnvironment
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import VERSION
from opencode_env.wire.answer import RolloutAnswer, inline_result
from tests.server_app import runtime_for
from tests.stub_server import StubServer, stub_arguments, stub_server

PER_RUN = {"sandbox_id", "wall_s", "timings", "provenance", "enforcement"}
"""What differs between two runs of one request: provenance holds the endpoint probe's own answer (or its error)."""


@pytest.fixture(scope="module")
def server() -> Iterator[StubServer]:
    with stub_server(command_s=0.05) as running:
        yield running


async def step(url: str, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async with connect(url.replace("http", "ws", 1) + "/ws", max_size=None) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        await ws.recv()
        action = {"type": "call_tool", "tool_name": tool_name, "arguments": arguments}
        await ws.send(json.dumps({"type": "step", "data": action}))
        answer: dict[str, Any] = json.loads(await ws.recv())
    assert answer["type"] == "observation", answer
    observation: dict[str, Any] = answer["data"]["observation"]
    return observation


async def test_the_websocket_answer_carries_the_standard_mcp_answer_once(server: StubServer) -> None:
    observation = await step(server.url, "run_rollout", stub_arguments("same"))
    assert observation["error"] is None
    result = observation["result"]
    assert set(result) == {"content", "structured_content", "meta", "data", "is_error"}
    assert result["is_error"] is False
    assert result["meta"] == {"io.modelcontextprotocol/serverInfo": {"name": "opencode_env", "version": VERSION}}
    [text] = result["content"]
    assert text["type"] == "text"
    answer = RolloutAnswer.model_validate(result["data"])
    assert answer.result_ref is not None
    assert f"GET {answer.result_ref.url}" in text["text"]
    assert result["structured_content"] is None
    async with Client(f"{server.url}/mcp") as client:
        standard = await client.call_tool("run_rollout", stub_arguments("same"))
    assert standard.structured_content is not None
    over_ws, over_mcp = await fetch_result(server.url, answer), inline_result(standard.structured_content)
    assert over_ws.task_id == "same"
    assert over_ws.model_dump(exclude=PER_RUN) == over_mcp.model_dump(exclude=PER_RUN)


async def test_bad_arguments_over_the_websocket_name_the_field_and_the_limit(server: StubServer) -> None:
    observation = await step(server.url, "run_rollout", {**stub_arguments(), "agent_timeout_s": -1})
    assert observation["result"] is None
    assert observation["error"]["error_type"] == "invalid_args"
    assert "agent_timeout_s" in observation["error"]["message"]
    assert "greater than 0" in observation["error"]["message"]


async def test_an_unknown_tool_over_the_websocket_is_named(server: StubServer) -> None:
    observation = await step(server.url, "run_rollouts", {})
    assert observation["error"]["error_type"] == "tool_not_found"
    assert "run_rollouts" in observation["error"]["message"]


async def test_a_call_past_the_servers_time_limit_says_so_and_closes_its_sandbox() -> None:
    backend = StubBackend(command_s=30)
    runtime = runtime_for(backend, max_rollouts=2)
    environment = OpenCodeEnvironment(runtime.mcp, backend.name)
    action = CallToolAction(tool_name="run_rollout", arguments=stub_arguments())
    observation = await environment.step_async(action, timeout_s=0.5)
    assert isinstance(observation, CallToolObservation)
    assert observation.result is None
    assert observation.error is not None
    assert observation.error.error_type == "timeout"
    assert "0.5 seconds" in observation.error.message
    assert backend.alive == set()


async def test_websocket_sessions_share_one_executor_thread(server: StubServer) -> None:
    before = threading.active_count()
    async with contextlib.AsyncExitStack() as sessions:
        for _ in range(10):
            ws = await sessions.enter_async_context(connect(server.url.replace("http", "ws", 1) + "/ws"))
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(await ws.recv())["type"] == "observation"
        assert threading.active_count() - before <= 2
