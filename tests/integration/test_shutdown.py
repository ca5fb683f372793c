"""A client that goes away, and a server told to stop, with rollouts in flight: every sandbox is closed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp.client.client import Client as SdkClient
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import connect as ws_connect

from opencode_env.client.client import OpenCodeEnv
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, stall
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.disconnect import PendingReplies
from opencode_env.server.mcp_endpoint import McpEndpoint
from opencode_env.server.session_quota import SessionQuota
from opencode_env.wire import RolloutResult
from opencode_env.wire.answer import inline_result
from tests.conftest import processes_mentioning
from tests.server_app import app_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server_url(backend: LocalBackend) -> Iterator[str]:
    server = ThreadedServer(app_for(backend))
    server.start()
    yield server.url
    server.stop()


async def wait_for(condition: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_client_that_disconnects_cancels_its_rollout(
    server_url: str, sandbox_base: Path, no_leaks: None
) -> None:
    with ScriptedModelServer(Script(steps=[stall(120)])) as model:

        async def client() -> None:
            async with OpenCodeEnv(server_url) as env:
                await env.run_rollout(demo_request(model.base_url, agent_timeout_s=100))

        running = asyncio.ensure_future(client())
        assert await wait_for(lambda: len(model.exchanges) >= 1 or running.done(), 120)
        assert not running.done(), f"the rollout ended before its first call: {running}"
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert await wait_for(lambda: not list(sandbox_base.iterdir()), 20)
    assert processes_mentioning(str(sandbox_base)) == []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


SIGTERM_BUDGET_S = 540.0
"""The whole of the SIGTERM test's waits, each taking what is left of it: a loaded machine slows every step (the
server's start most), and no step has a bound of its own to miss while the others are quick."""


@pytest.mark.timeout(SIGTERM_BUDGET_S + 60)
async def test_sigterm_answers_calls_in_flight_with_a_cancelled_result_and_closes_their_sandboxes(
    tmp_path: Path,
) -> None:
    budget = Budget(SIGTERM_BUDGET_S)
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "OPENCODE_ENV_BACKEND": "local",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "TMPDIR": str(sandboxes),
    }
    log = (tmp_path / "server.log").open("wb")
    command = [sys.executable, "-m", "opencode_env.server.app"]
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        assert await _ready(url, budget), (tmp_path / "server.log").read_text()
        # The served process declines per-message deflate on /ws (it cost more of the loop than a call's handling).
        async with ws_connect(f"ws://127.0.0.1:{port}/ws", compression="deflate", open_timeout=budget.left()) as probe:
            assert probe.response is not None
            assert "Sec-WebSocket-Extensions" not in probe.response.headers
        with ScriptedModelServer(Script(steps=[stall(120)])) as model:
            request = demo_request(model.base_url, agent_timeout_s=100, setup=["echo set-up"])

            async def through_websocket() -> RolloutResult:
                async with OpenCodeEnv(url) as session:
                    result: RolloutResult = await session.run_rollout(request)
                    return result

            async def through_standard_mcp() -> RolloutResult:
                async with SdkClient(f"{url}/mcp", mode="legacy") as client:
                    # Listed first, as an MCP client does: otherwise the SDK lists the tools after the answer (to
                    # check it against the output schema), and that request races the server's exit.
                    await client.list_tools()
                    answer = await client.call_tool("run_rollout", request.model_dump(mode="json"))
                    return inline_result(answer.structured_content)

            calls = [asyncio.ensure_future(through_websocket()), asyncio.ensure_future(through_standard_mcp())]
            assert await wait_for(lambda: len(model.exchanges) >= 2, budget.left())
            # each rollout's agent's box and its grader's box (set up while the agent works)
            assert len([p for p in sandboxes.iterdir() if p.name.startswith("opencode-env-")]) == 4
            # ...started from the standard library's event loop: uvicorn would pick uvloop, which forks the server
            # for each of the sandboxes' subprocesses (bench.event_loop_spawn), and a loaded uvloop is mapped
            assert "uvloop" not in Path(f"/proc/{server.pid}/maps").read_text()
            server.send_signal(signal.SIGTERM)
            results = await asyncio.wait_for(asyncio.gather(*calls), budget.left())
            exit_code = await asyncio.to_thread(server.wait, budget.left())
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()
    for result in results:
        assert result.status == "cancelled"
        assert result.error is not None
        assert "shutting down" in result.error
        assert result.failed_phase == "agent"
        assert [r.stdout for r in result.setup_results] == ["set-up\n"]
        assert result.sandbox_id.startswith("local-")
    # uvicorn finishes its shutdown, then re-raises the signal so the exit status tells how it ended.
    assert exit_code in (0, -signal.SIGTERM)
    log_text = (tmp_path / "server.log").read_text()
    assert "Application shutdown complete" in log_text
    # Nothing was left for uvicorn to cut off: the MCP session's open event stream was ended too.
    assert "timeout graceful shutdown exceeded" not in log_text
    assert [p.name for p in sandboxes.iterdir() if p.name.startswith("opencode-env-")] == []
    assert processes_mentioning(str(sandboxes)) == []


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)


async def _ready(url: str, budget: Budget) -> bool:
    """Ready, not only alive: /health answers while the app is still being built, /metadata once it is. Each probe
    waits for its answer as long as the budget lasts (a loaded machine answers the first one slowly); only a refused
    connection (nothing listens yet) is tried again."""
    async with httpx.AsyncClient(trust_env=False) as http:
        while budget.left() > 0:
            try:
                answer = await http.get(f"{url}/metadata", timeout=budget.left())
            except httpx.ConnectError:
                await asyncio.sleep(0.1)
                continue
            except httpx.TimeoutException:
                return False
            if answer.status_code == 200:
                return True
            await asyncio.sleep(0.1)
    return False


async def test_a_shutdown_waits_for_an_mcp_post_s_answer_before_uvicorn_hears_the_signal() -> None:
    """uvicorn's exit ends every event stream at once (sse-starlette hooks it): a tool call's answer, which goes out
    on its POST's own stream, must have gone out before the server passes the signal on."""
    replies = PendingReplies()
    answer_ready = asyncio.Event()
    sent: list[Message] = []

    async def standard(scope: Scope, receive: Receive, send: Send) -> None:
        await answer_ready.wait()
        await send({"type": "http.response.body", "body": b"data: result\n\n", "more_body": False})

    async def elsewhere(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("a standard MCP POST went elsewhere")

    router = McpEndpoint(
        standard=standard,
        stateless=elsewhere,
        openenv=elsewhere,
        closing=asyncio.Event(),
        replies=replies,
        quota=SessionQuota(1, list),
    )
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}).encode()
    incoming = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"mcp-session-id", b"s")]}
    call = asyncio.ensure_future(router(scope, receive, send))
    settled = asyncio.ensure_future(replies.settled(10))
    await asyncio.sleep(0.2)
    assert not settled.done()
    answer_ready.set()
    await asyncio.wait_for(settled, 5)
    await call
    assert sent[-1]["body"] == b"data: result\n\n"
