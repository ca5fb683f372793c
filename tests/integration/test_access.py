"""Who may use the server, decided per request: the token, the loopback-only default, and the reasons clients see."""

from __future__ import annotations

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
from fastmcp import Client as FastMCPClient
from mcp.client.client import Client as SdkClient

from opencode_env.client.client import OpenCodeEnv
from tests.server_app import app_for
from tests.stub_server import StubServer, stub_server

TOKEN = "t0k-for-tests"
ROOT = Path(__file__).resolve().parents[2]
LISTING = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
STREAM = {"accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def guarded() -> Iterator[StubServer]:
    with stub_server(command_s=0.05, token=TOKEN) as running:
        yield running


def test_health_is_open_and_everything_else_needs_the_token(guarded: StubServer) -> None:
    url = guarded.url
    assert httpx.get(f"{url}/health").status_code == 200
    refused = httpx.get(f"{url}/metadata")
    assert refused.status_code == 401
    assert "OPENCODE_ENV_TOKEN" in refused.json()["error"]
    wrong = httpx.get(f"{url}/metadata", headers={"authorization": "Bearer wrong"})
    assert (wrong.status_code, "does not match" in wrong.json()["error"]) == (401, True)
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert httpx.get(f"{url}/metadata", headers={"authorization": f"{scheme} {TOKEN}"}).status_code == 200
    assert httpx.post(f"{url}/mcp/stream", json=LISTING, headers=STREAM).status_code == 401
    shim = httpx.post(f"{url}/mcp", json=LISTING)
    assert shim.status_code == 401
    assert "OPENCODE_ENV_TOKEN" in shim.json()["error"]["message"]


def messages(error: BaseException) -> list[str]:
    """Every message in an error, through the exception groups the SDK's task groups wrap it in."""
    if isinstance(error, BaseExceptionGroup):
        return [text for inner in error.exceptions for text in messages(inner)]
    return [str(error)]


async def test_mcp_clients_take_the_token_and_show_the_reason_without_it(guarded: StubServer) -> None:
    async with FastMCPClient(f"{guarded.url}/mcp", auth=TOKEN) as client:
        assert [tool.name for tool in await client.list_tools()] == ["run_rollout"]
    clients = [
        lambda: SdkClient(f"{guarded.url}/mcp", mode="legacy"),
        lambda: SdkClient(f"{guarded.url}/mcp"),
        lambda: FastMCPClient(f"{guarded.url}/mcp", auth="wrong"),
    ]
    for make in clients:
        with pytest.raises(BaseException) as refused:  # noqa: PT011 (the SDK raises an ExceptionGroup)
            async with make() as client:
                await client.list_tools()
        assert any("OPENCODE_ENV_TOKEN" in text for text in messages(refused.value)), messages(refused.value)


async def test_the_websocket_needs_the_token_and_says_why(guarded: StubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENCODE_ENV_TOKEN", raising=False)
    with pytest.raises(ConnectionError, match="OPENCODE_ENV_TOKEN"):
        async with OpenCodeEnv(guarded.url) as env:
            await env.list_tools()
    with pytest.raises(ConnectionError, match="does not match"):
        async with OpenCodeEnv(guarded.url, token="wrong") as env:
            await env.list_tools()
    async with OpenCodeEnv(guarded.url, token=TOKEN) as env:
        assert [tool.name for tool in await env.list_tools()] == ["run_rollout"]
    monkeypatch.setenv("OPENCODE_ENV_TOKEN", TOKEN)
    async with OpenCodeEnv(guarded.url) as env:
        assert [tool.name for tool in await env.list_tools()] == ["run_rollout"]


async def test_without_a_token_only_this_machine_is_served_whatever_address_the_app_listens_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENCODE_ENV_ALLOW_UNAUTHENTICATED", raising=False)
    app = app_for(token="")

    def client(address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        return httpx.AsyncClient(transport=transport, base_url="http://testserver")

    async with client("203.0.113.7") as remote:
        assert (await remote.get("/health")).status_code == 200
        refused = await remote.get("/metadata")
        assert refused.status_code == 403
        assert "OPENCODE_ENV_TOKEN" in refused.json()["error"]
        for path in ("/mcp", "/mcp/stream"):
            answer = await remote.post(path, json=LISTING, headers=STREAM)
            assert answer.status_code == 403
            assert "OPENCODE_ENV_TOKEN" in answer.json()["error"]["message"]
        assert (await remote.post("/step", json={"action": {"tool_name": "run_rollout"}})).status_code == 403
    async with client("127.0.0.1") as local:
        assert (await local.get("/metadata")).status_code == 200
        relayed = await local.get("/metadata", headers={"x-forwarded-for": "203.0.113.7"})
        assert relayed.status_code == 403
    monkeypatch.setenv("OPENCODE_ENV_ALLOW_UNAUTHENTICATED", "1")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app_for(token=""), client=("203.0.113.7", 40000)),
        base_url="http://testserver",
    ) as trusted:
        assert (await trusted.get("/metadata")).json()["access"] == "open"


def own_non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.timeout(120)
def test_uvicorn_serving_the_importable_app_on_all_interfaces_starts_and_refuses_strangers(tmp_path: Path) -> None:
    address = own_non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENCODE_ENV_TOKEN", "OPENCODE_ENV_ALLOW_UNAUTHENTICATED")}
    env["OPENCODE_ENV_BACKEND"] = "local"
    log = (tmp_path / "server.log").open("wb")
    command = [sys.executable, "-m", "uvicorn", "opencode_env.server.app:app", "--host", "0.0.0.0", "--port", str(port)]
    server = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/metadata", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        assert httpx.get(f"http://{address}:{port}/health").status_code == 200
        stranger = httpx.get(f"http://{address}:{port}/metadata")
        assert stranger.status_code == 403
        assert "OPENCODE_ENV_TOKEN" in stranger.json()["error"]
        assert httpx.get(f"http://127.0.0.1:{port}/metadata").json()["backend"] == "local"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def test_serve_help_explains_the_access_token(capsys: pytest.CaptureFixture[str]) -> None:
    from opencode_env.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    assert "OPENCODE_ENV_TOKEN" in text
    assert "Authorization: Bearer" in text
    assert "OPENCODE_ENV_ALLOW_UNAUTHENTICATED" in text


async def test_a_route_added_to_the_built_app_comes_before_openenvs() -> None:
    app = app_for(token="")

    @app.get("/extra")
    def extra() -> dict[str, str]:
        return {"served": "here"}

    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await client.get("/extra")).json() == {"served": "here"}
        assert (await client.get("/health")).json()["status"] == "healthy"
        assert (await client.get("/schema")).status_code == 200
        assert (await client.get("/nowhere")).status_code == 404
