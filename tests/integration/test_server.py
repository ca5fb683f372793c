"""The server end to end: a real uvicorn on loopback, the real OpenCode, the scripted model, the local backend."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from openenv.core.mcp_client import MCPToolClient

from opencode_env.client.client import OpenCodeEnv
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.testing.demo import demo_request
from opencode_env.testing.script import Script, Step, demo_script
from opencode_env.testing.scripted_model import ScriptedModelServer
from opencode_env.testing.threaded_server import ThreadedServer
from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.answer import inline_result
from tests.server_app import app_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server_url(backend: LocalBackend) -> Iterator[str]:
    server = ThreadedServer(app_for(backend))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def model() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(demo_script()) as running:
        yield running


def arguments(request: RolloutRequest) -> dict[str, Any]:
    return request.model_dump(mode="json")


def assert_demo_result(result: RolloutResult) -> None:
    assert isinstance(result, RolloutResult)
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert len(result.proxy_turns) == 3
    assert all(turn.aligned for turn in result.proxy_turns)


async def test_openenv_client_lists_the_documented_tool_and_runs_it(
    server_url: str, model: ScriptedModelServer, no_leaks: None
) -> None:
    async with MCPToolClient(base_url=server_url) as env:
        tools = await env.list_tools()
        assert [tool.name for tool in tools] == ["run_rollout"]
        schema = tools[0].input_schema
        assert set(schema["properties"]) == set(RolloutRequest.model_fields)
        assert schema["required"] == ["instruction"]
        assert schema["properties"]["top_logprobs"]["maximum"] == 20
        assert schema["properties"]["mode"]["enum"] == ["transparent_proxy", "black_box"]
        assert schema["properties"]["instruction"]["description"]
        data = await env.call_tool("run_rollout", **arguments(demo_request(model.base_url)))
    assert_demo_result(RolloutResult.model_validate(data))


async def test_a_standard_mcp_client_initializes_lists_and_calls(
    server_url: str, model: ScriptedModelServer, no_leaks: None
) -> None:
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with Client(f"{server_url}/mcp/stream") as client:
        tools = await client.list_tools()
        assert [tool.name for tool in tools] == ["run_rollout"]
        assert {"status", "reward", "result_ref", "result"} <= set(tools[0].output_schema["properties"])
        answer = await client.call_tool(
            "run_rollout", arguments(demo_request(model.base_url)), progress_handler=on_progress
        )
    assert_demo_result(inline_result(answer.structured_content))
    assert any(message.startswith("agent:") for message in progress)
    assert any(message.startswith("verify:") for message in progress)


async def test_bad_arguments_are_named_in_the_error(server_url: str) -> None:
    async with Client(f"{server_url}/mcp/stream") as client:
        with pytest.raises(Exception, match="top_logprobs"):
            await client.call_tool("run_rollout", {"instruction": "x", "top_logprobs": 99})
    with pytest.raises(ValueError, match="max_tokens_cap"):
        await OpenCodeEnv(server_url).run_rollout(instruction="x", max_tokens_cap=0)


async def test_the_async_client(server_url: str, model: ScriptedModelServer, no_leaks: None) -> None:
    async with OpenCodeEnv(base_url=server_url) as env:
        result = await env.run_rollout(**arguments(demo_request(model.base_url)))
    assert_demo_result(result)


def test_the_sync_wrapper(server_url: str, model: ScriptedModelServer, no_leaks: None) -> None:
    with OpenCodeEnv(base_url=server_url).sync() as env:
        result = env.run_rollout(**arguments(demo_request(model.base_url)))
    assert_demo_result(result)


async def test_the_notebook_form_inside_a_running_event_loop(
    server_url: str, model: ScriptedModelServer, no_leaks: None
) -> None:
    asyncio.get_running_loop()
    with OpenCodeEnv(base_url=server_url) as env:
        env.reset()
        result = env.run_rollout(
            base_url=model.base_url,
            api_key="sk-demo",
            model="scripted-policy",
            endpoint="vllm",
            instruction="Write add.py",
            setup=[],
            verify=["test -f /home/user/workdir/add.py"],
            task_id="binary_search_v1",
        )
    assert result.task_id == "binary_search_v1"
    assert (result.reward, len(result.proxy_turns)) == (1.0, 3)


async def test_two_rollouts_in_parallel_through_two_sessions(
    server_url: str, model: ScriptedModelServer, no_leaks: None
) -> None:
    requests = [demo_request(model.base_url, task_id=f"group_{index}") for index in range(2)]
    results = await OpenCodeEnv(server_url).run_rollouts(requests, max_concurrency=2, progress=False)
    assert [result.task_id for result in results] == ["group_0", "group_1"]
    for result in results:
        assert_demo_result(result)
    assert len({turn.headers["x-session-id"] for result in results for turn in result.proxy_turns}) == 2


@pytest.mark.timeout(240)
async def test_a_rollout_longer_than_a_minute_completes_on_every_path(server_url: str, no_leaks: None) -> None:
    slow = Script(steps=[Step(content="slow " * 32, token_delay_s=1.0)])
    with ScriptedModelServer(slow) as slow_model:
        request = demo_request(slow_model.base_url, verify=[], agent_timeout_s=180)

        async def through_openenv() -> RolloutResult:
            async with OpenCodeEnv(base_url=server_url) as env:
                result: RolloutResult = await env.run_rollout(request)
                return result

        async def through_standard_mcp() -> RolloutResult:
            async with Client(f"{server_url}/mcp/stream", timeout=300) as client:
                answer = await client.call_tool("run_rollout", arguments(request))
                return inline_result(answer.structured_content)

        def through_sync_wrapper() -> RolloutResult:
            with OpenCodeEnv(base_url=server_url).sync() as env:
                result: RolloutResult = env.run_rollout(request)
                return result

        results = await asyncio.gather(
            through_openenv(), through_standard_mcp(), asyncio.to_thread(through_sync_wrapper)
        )
    for result in results:
        assert result.status == "completed", result.error
        assert (result.timings.agent_s or 0) > 60
        assert result.proxy_turns[0].latency_s > 60


def test_openenv_validate_passes_on_the_repo() -> None:
    completed = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "openenv"), "validate", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "[OK]" in completed.stdout
