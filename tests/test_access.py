"""Bearer-token access: every route but /health needs the token when the server has one."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastmcp import Client

from opencode_env.client import OpenCodeEnv
from opencode_env.sandbox.local import LocalBackend
from opencode_env.testing.threaded_server import ThreadedServer
from server.app import build_app
from server.auth import refuse_unprotected_local
from server.environment import configure

TOKEN = "t0k-for-tests"


@pytest.fixture(scope="module")
def guarded_url(backend: LocalBackend) -> Iterator[str]:
    configure(backend)
    server = ThreadedServer(build_app(token=TOKEN))
    server.start()
    yield server.url
    server.stop()


def test_health_is_open_and_everything_else_needs_the_token(guarded_url: str) -> None:
    assert httpx.get(f"{guarded_url}/health").status_code == 200
    refused = httpx.get(f"{guarded_url}/metadata")
    assert refused.status_code == 401
    assert "OPENCODE_ENV_TOKEN" in refused.json()["error"]
    assert httpx.get(f"{guarded_url}/metadata", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{guarded_url}/metadata", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"accept": "application/json, text/event-stream"}
    assert httpx.post(f"{guarded_url}/mcp/stream", json=listing, headers=headers).status_code == 401
    assert httpx.post(f"{guarded_url}/mcp", json=listing).status_code == 401


async def test_the_standard_mcp_endpoint_takes_the_token(guarded_url: str) -> None:
    async with Client(f"{guarded_url}/mcp/stream", auth=TOKEN) as client:
        assert [tool.name for tool in await client.list_tools()] == ["run_rollout"]


async def test_the_websocket_needs_the_token(guarded_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENCODE_ENV_TOKEN", raising=False)
    with pytest.raises(ConnectionError):
        async with OpenCodeEnv(guarded_url) as env:
            await env.list_tools()
    async with OpenCodeEnv(guarded_url, token=TOKEN) as env:
        assert [tool.name for tool in await env.list_tools()] == ["run_rollout"]
    monkeypatch.setenv("OPENCODE_ENV_TOKEN", TOKEN)
    async with OpenCodeEnv(guarded_url) as env:
        assert [tool.name for tool in await env.list_tools()] == ["run_rollout"]


def test_the_local_backend_is_not_served_beyond_loopback_without_a_token() -> None:
    refusal = refuse_unprotected_local("0.0.0.0", "local", token="", allow=False)
    assert refusal is not None
    assert "OPENCODE_ENV_TOKEN" in refusal
    assert "run commands on this machine" in refusal
    assert refuse_unprotected_local("127.0.0.1", "local", token="", allow=False) is None
    assert refuse_unprotected_local("::1", "local", token="", allow=False) is None
    assert refuse_unprotected_local("0.0.0.0", "local", token="t", allow=False) is None
    assert refuse_unprotected_local("0.0.0.0", "local", token="", allow=True) is None
    assert refuse_unprotected_local("0.0.0.0", "e2b", token="", allow=False) is None
