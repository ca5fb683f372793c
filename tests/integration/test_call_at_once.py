"""A script that starts `opencode-env serve` and calls the tool as soon as /health answers succeeds with every
client we name: the MCP SDK, fastmcp, OpenEnv's MCPToolClient, our OpenCodeEnv and plain JSON-RPC, all at once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastmcp import Client as FastMCPClient
from mcp.client.client import Client as SdkClient
from openenv.core.mcp_client import MCPToolClient

from opencode_env.client.client import OpenCodeEnv
from tests.integration.test_access import free_port

ROOT = Path(__file__).resolve().parents[2]


async def sdk(url: str) -> list[str]:
    async with SdkClient(f"{url}/mcp", mode="auto") as client:
        return [tool.name for tool in (await client.list_tools()).tools]


async def fastmcp(url: str) -> list[str]:
    async with FastMCPClient(f"{url}/mcp") as client:
        return [tool.name for tool in await client.list_tools()]


async def openenv(url: str) -> list[str]:
    # Its WebSocket handshake gives up after 10 s by default; a loading server completes it once loaded, which on a
    # busy 2-core machine can take longer (docs/results.md says to pass connect_timeout_s or wait on /ready).
    async with MCPToolClient(base_url=url, connect_timeout_s=120) as env:
        return [tool.name for tool in await env.list_tools()]


async def ours(url: str) -> list[str]:
    async with OpenCodeEnv(url) as env:
        return [tool.name for tool in await env.list_tools()]


async def plain(url: str) -> list[str]:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx.AsyncClient(timeout=120) as http:
        answer = (await http.post(f"{url}/mcp", json=call)).json()
    return [tool["name"] for tool in answer["result"]["tools"]]


@pytest.mark.timeout(240)
async def test_every_client_called_as_soon_as_health_answers_succeeds(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "OPENCODE_ENV_TOKEN"}
    log = (tmp_path / "server.log").open("wb")
    command = [sys.executable, "-m", "opencode_env.cli", "serve", "--backend", "local", "--port", str(port)]
    server = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            deadline = time.monotonic() + 60
            while server.poll() is None and time.monotonic() < deadline:
                try:
                    if (await http.get(f"{url}/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    await asyncio.sleep(0.02)
            listings = await asyncio.gather(sdk(url), fastmcp(url), openenv(url), ours(url), plain(url))
            assert listings == [["run_rollout"]] * 5, (tmp_path / "server.log").read_text()
            assert (await http.get(f"{url}/ready")).status_code == 200
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
