"""The server end to end: a real uvicorn on loopback, the real OpenCode, the scripted model, the local backend.

Each client family runs one real rollout end to end here: a standard MCP client
(`test_a_standard_mcp_client_initializes_lists_and_calls`), OpenCodeEnv
(`test_two_rollouts_in_parallel_through_two_sessions`) and OpenEnv's MCPToolClient (the real rollout longer than a
minute, `test_openenv_mcp_tool_client_waits_past_60_s_with_the_documented_timeout`). The other calls (the OpenEnv
client's listing and call, the async client's one call, the sync wrapper, the notebook form, the other waits past a
minute) test a client's path, not the agent: a real server answers them with a stand-in rollout (`tests/stand_in.py`)
whose result is a recorded real one, and each checks that it came back whole and that its request got there."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from openenv.core.mcp_client import MCPToolClient

from opencode_env.client.by_reference import fetch_result
from opencode_env.client.client import OpenCodeEnv
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, Step, demo_script
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.wire import RolloutRequest, RolloutResult
from opencode_env.wire.answer import inline_result
from tests.server_app import app_for
from tests.stand_in import StandInRollouts, recorded_result, stand_in_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server_url(backend: LocalBackend) -> Iterator[str]:
    server = ThreadedServer(app_for(backend))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def stand_in() -> Iterator[tuple[str, StandInRollouts]]:
    rollouts = StandInRollouts(recorded_result())
    with stand_in_server(rollouts) as url:
        yield url, rollouts


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


def assert_whole(result: RolloutResult, task_id: str) -> None:
    """The stand-in's recorded result, parsed back whole (every turn's tokens, logprobs and rebuilt prompts)."""
    assert_demo_result(result)
    assert result.task_id == task_id
    recorded = recorded_result()
    assert result.proxy_turns == recorded.proxy_turns
    assert result.model_dump(exclude={"task_id"}) == recorded.model_dump(exclude={"task_id"})


async def test_openenv_client_lists_the_documented_tool_and_runs_it(stand_in: tuple[str, StandInRollouts]) -> None:
    url, rollouts = stand_in
    request = demo_request("http://127.0.0.1:9/v1", task_id="openenv_client")
    async with MCPToolClient(base_url=url) as env:
        tools = await env.list_tools()
        assert [tool.name for tool in tools] == ["run_rollout"]
        schema = tools[0].input_schema
        assert set(schema["properties"]) == set(RolloutRequest.model_fields)
        assert schema["required"] == ["instruction"]
        assert schema["properties"]["top_logprobs"]["maximum"] == 20
        assert schema["properties"]["mode"]["enum"] == ["transparent_proxy", "black_box"]
        assert schema["properties"]["instruction"]["description"]
        data = await env.call_tool("run_rollout", **arguments(request))
    assert_whole(await fetch_result(url, data), "openenv_client")
    assert request in rollouts.requests


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


async def test_the_async_client(stand_in: tuple[str, StandInRollouts]) -> None:
    url, rollouts = stand_in
    request = demo_request("http://127.0.0.1:9/v1", task_id="async_client")
    async with OpenCodeEnv(base_url=url) as env:
        result = await env.run_rollout(**arguments(request))
    assert_whole(result, "async_client")
    assert request in rollouts.requests


def test_the_sync_wrapper(stand_in: tuple[str, StandInRollouts]) -> None:
    url, rollouts = stand_in
    request = demo_request("http://127.0.0.1:9/v1", task_id="sync_wrapper")
    with OpenCodeEnv(base_url=url).sync() as env:
        result = env.run_rollout(**arguments(request))
    assert_whole(result, "sync_wrapper")
    assert request in rollouts.requests


async def test_the_notebook_form_inside_a_running_event_loop(stand_in: tuple[str, StandInRollouts]) -> None:
    url, rollouts = stand_in
    asyncio.get_running_loop()
    with OpenCodeEnv(base_url=url) as env:
        env.reset()
        result = env.run_rollout(
            base_url="http://127.0.0.1:9/v1",
            api_key="sk-demo",
            model="scripted-policy",
            endpoint="vllm",
            instruction="Write add.py",
            setup=[],
            verify=["test -f /home/user/workdir/add.py"],
            task_id="binary_search_v1",
        )
    assert_whole(result, "binary_search_v1")
    (sent,) = [request for request in rollouts.requests if request.task_id == "binary_search_v1"]
    assert (sent.base_url, sent.model, sent.endpoint, sent.instruction) == (
        "http://127.0.0.1:9/v1",
        "scripted-policy",
        "vllm",
        "Write add.py",
    )
    assert (sent.setup, sent.verify, sent.api_key) == ([], ["test -f /home/user/workdir/add.py"], "sk-demo")


async def test_two_rollouts_in_parallel_through_two_sessions(
    server_url: str, model: ScriptedModelServer, no_leaks: None
) -> None:
    requests = [demo_request(model.base_url, task_id=f"group_{index}") for index in range(2)]
    results = await OpenCodeEnv(server_url).run_rollouts(requests, max_concurrency=2, progress=False)
    assert [result.task_id for result in results] == ["group_0", "group_1"]
    for result in results:
        assert_demo_result(result)
    assert len({turn.headers["x-session-id"] for result in results for turn in result.proxy_turns}) == 2


LongCalls = dict[str, RolloutResult | BaseException]
SLOW_ANSWER = "slow " * 32


@pytest.fixture(scope="module")
async def longer_than_a_minute(server_url: str) -> LongCalls:
    """Every wait past a minute at once, each its own caller, so they share one minute: a real rollout whose one
    model call streams for 64 s, through OpenEnv's MCPToolClient with its documented timeout; and a stand-in rollout
    answering after 65 s, through OpenCodeEnv, a standard MCP client and the sync wrapper (each keeps waiting with no
    message for longer than a 60 s default would). Every call is over before a test reads its outcome, so the leak
    check of the test that reads the real one covers its sandbox whichever test asked first."""
    slow = Script(steps=[Step(content=SLOW_ANSWER, token_delay_s=1.0)])
    stand_in = StandInRollouts(recorded_result(), seconds=65)
    with ScriptedModelServer(slow) as slow_model, stand_in_server(stand_in) as stand_in_url:

        async def real_through_mcp_tool_client() -> RolloutResult:
            real = demo_request(slow_model.base_url, verify=[], agent_timeout_s=180, task_id="real_slow")
            async with MCPToolClient(base_url=server_url, message_timeout_s=3600) as env:
                answer = await env.call_tool("run_rollout", **arguments(real))
            return await fetch_result(server_url, answer)

        async def through_opencode_env() -> RolloutResult:
            async with OpenCodeEnv(base_url=stand_in_url) as env:
                result: RolloutResult = await env.run_rollout(demo_request("http://127.0.0.1:9/v1", task_id="async"))
                return result

        async def through_standard_mcp() -> RolloutResult:
            async with Client(f"{stand_in_url}/mcp/stream", timeout=300) as client:
                request = demo_request("http://127.0.0.1:9/v1", task_id="standard_mcp")
                answer = await client.call_tool("run_rollout", arguments(request))
                return inline_result(answer.structured_content)

        def through_sync_wrapper() -> RolloutResult:
            with OpenCodeEnv(base_url=stand_in_url).sync() as env:
                result: RolloutResult = env.run_rollout(demo_request("http://127.0.0.1:9/v1", task_id="sync_wrapper"))
                return result

        names = ["real_slow", "async", "standard_mcp", "sync_wrapper"]
        outcomes = await asyncio.gather(
            real_through_mcp_tool_client(),
            through_opencode_env(),
            through_standard_mcp(),
            asyncio.to_thread(through_sync_wrapper),
            return_exceptions=True,
        )
    return dict(zip(names, outcomes, strict=True))


def outcome_of(calls: LongCalls, name: str) -> RolloutResult:
    outcome = calls[name]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def assert_real_and_longer_than_a_minute(result: RolloutResult) -> None:
    """The scripted model sleeps 1 s before each of the answer's 64 tokens, so a turn that holds the whole answer
    streamed for longer than a minute by construction (no clock is read: a busy machine only makes it longer)."""
    assert result.status == "completed", result.error
    assert result.task_id == "real_slow"
    assert "".join(result.proxy_turns[0].completion_tokens).startswith(SLOW_ANSWER)


@pytest.mark.timeout(240)
async def test_a_rollout_longer_than_a_minute_completes_on_every_path(
    longer_than_a_minute: LongCalls, no_leaks: None
) -> None:
    assert_real_and_longer_than_a_minute(outcome_of(longer_than_a_minute, "real_slow"))
    for name in ("async", "standard_mcp", "sync_wrapper"):
        assert_whole(outcome_of(longer_than_a_minute, name), name)


@pytest.mark.timeout(240)
async def test_openenv_mcp_tool_client_waits_past_60_s_with_the_documented_timeout(
    longer_than_a_minute: LongCalls,
) -> None:
    """MCPToolClient reads each answer under `message_timeout_s` (60 s by default); a WebSocket ping does not count
    as an answer, so the caller passes more than the rollout's budget (docs/results.md)."""
    assert_real_and_longer_than_a_minute(outcome_of(longer_than_a_minute, "real_slow"))


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
