"""Cancelling a call over HTTP stops its rollout and closes its sandbox; no caller can cancel another's rollout."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client as FastMCPClient
from mcp.client.client import Client as SdkClient

from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, stall
from opencode_env.scripted.threaded_server import ThreadedServer
from tests.conftest import processes_mentioning
from tests.server_app import app_for
from tests.stub_server import StubServer, stub_arguments, stub_server, wait_until

pytestmark = pytest.mark.timeout(120)
STREAM = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
PROTOCOL = "2025-06-18"


@pytest.fixture
def server() -> Iterator[StubServer]:
    # Setup "commands" sleep 60 s: a rollout stays in its setup phase until it is cancelled.
    with stub_server(command_s=60) as running:
        yield running


class Session:
    """A standard MCP session over raw HTTP, so the test controls every message, ids included."""

    def __init__(self, http: httpx.AsyncClient, url: str, session_id: str) -> None:
        self.http, self.url, self.session_id = http, url, session_id

    @classmethod
    async def open(cls, http: httpx.AsyncClient, url: str) -> Session:
        hello = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        response = await http.post(f"{url}/mcp", json=initialize, headers=STREAM)
        session = cls(http, url, response.headers["mcp-session-id"])
        await session.notify("notifications/initialized", {})
        return session

    def headers(self) -> dict[str, str]:
        return {**STREAM, "mcp-session-id": self.session_id, "mcp-protocol-version": PROTOCOL}

    async def notify(self, method: str, params: dict[str, Any]) -> int:
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        response = await self.http.post(f"{self.url}/mcp", json=message, headers=self.headers())
        return response.status_code

    async def call(self, request_id: int, arguments: dict[str, Any]) -> list[Any]:
        """A tools/call; returns the JSON-RPC messages its stream carried before it ended."""
        params = {"name": "run_rollout", "arguments": arguments}
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        answers = []
        async with self.http.stream("POST", f"{self.url}/mcp", json=message, headers=self.headers()) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    answers.append(json.loads(line[5:]))
        return answers


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=90) as client:
        yield client


async def test_a_cancel_notification_stops_the_rollout_and_closes_its_sandbox(
    server: StubServer, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="opencode_env.server")
    session = await Session.open(http, server.url)
    call = asyncio.ensure_future(session.call(7, stub_arguments("victim")))
    assert await wait_until(lambda: bool(server.backend.alive), 20)
    assert await session.notify("notifications/cancelled", {"requestId": 7, "reason": "test"}) == 202
    assert await wait_until(lambda: not server.backend.alive, 10)
    await asyncio.wait_for(call, 10)
    assert "rollout victim cancelled by its caller: its sandbox is closed" in caplog.text


async def test_another_callers_cancel_with_the_same_request_id_changes_nothing(
    server: StubServer, http: httpx.AsyncClient
) -> None:
    victim = await Session.open(http, server.url)
    call = asyncio.ensure_future(victim.call(7, stub_arguments("victim")))
    assert await wait_until(lambda: bool(server.backend.alive), 20)
    attacker = await Session.open(http, server.url)
    await attacker.notify("notifications/cancelled", {"requestId": 7})
    sessionless = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
    await http.post(f"{server.url}/mcp", json=sessionless, headers={**STREAM, "mcp-protocol-version": PROTOCOL})
    await http.post(f"{server.url}/mcp", json=sessionless)
    await asyncio.sleep(2)
    assert len(server.backend.alive) == 1
    assert not call.done()
    await victim.notify("notifications/cancelled", {"requestId": 7})
    assert await wait_until(lambda: not server.backend.alive, 10)
    await asyncio.wait_for(call, 10)


@pytest.mark.parametrize("client_kind", ["sdk_legacy", "sdk_auto", "fastmcp"])
async def test_a_client_that_cancels_its_call_closes_the_sandbox(server: StubServer, client_kind: str) -> None:
    url = f"{server.url}/mcp"
    client: Any = FastMCPClient(url) if client_kind == "fastmcp" else SdkClient(url, mode=client_kind[4:])
    async with client:
        call = asyncio.ensure_future(client.call_tool("run_rollout", stub_arguments()))
        assert await wait_until(lambda: bool(server.backend.alive), 20)
        call.cancel()
        assert await wait_until(lambda: not server.backend.alive, 10)


async def test_cancelling_a_real_rollout_closes_its_local_sandbox(backend: LocalBackend, sandbox_base: Path) -> None:
    server = ThreadedServer(app_for(backend))
    server.start()
    try:
        with ScriptedModelServer(Script(steps=[stall(120)])) as model:
            request = demo_request(model.base_url, agent_timeout_s=100)
            async with SdkClient(f"{server.url}/mcp", mode="legacy") as client:
                call = asyncio.ensure_future(client.call_tool("run_rollout", request.model_dump(mode="json")))
                assert await wait_until(lambda: len(model.exchanges) >= 1, 60)
                call.cancel()
                assert await wait_until(lambda: not list(sandbox_base.iterdir()), 15)
    finally:
        server.stop()
    assert processes_mentioning(str(sandbox_base)) == []
