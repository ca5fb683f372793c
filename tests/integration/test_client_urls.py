"""The URL a caller gives `OpenCodeEnv`: the server's root or one of its routes works; no server fails fast, naming
the URL. Against a real server on loopback (the stub backend behind it)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from opencode_env import OpenCodeEnv
from opencode_env.client.client import server_root
from opencode_env.wire import TOOL_NAME
from tests.stub_server import StubServer, stub_server


@pytest.fixture(scope="module")
def running() -> Iterator[StubServer]:
    with stub_server(command_s=0.01) as server:
        yield server


@pytest.mark.parametrize("route", ["", "/", "/mcp", "/mcp/", "/mcp/stream", "/ws", "/web"])
async def test_the_servers_root_or_any_of_its_routes_reaches_the_tool(running: StubServer, route: str) -> None:
    async with OpenCodeEnv(base_url=running.url + route) as env:
        assert [tool.name for tool in await env.list_tools()] == [TOOL_NAME]
        assert env.base_url == running.url


def test_a_path_prefix_before_the_route_is_kept() -> None:
    assert server_root("https://host/env/mcp") == "https://host/env"
    assert server_root("https://NAME.hf.space/web/") == "https://NAME.hf.space"


def test_a_url_that_is_no_url_is_refused_naming_the_form() -> None:
    with pytest.raises(ValueError, match=r"base_url: the server's URL, e\.g\. http://localhost:8000"):
        OpenCodeEnv(base_url="localhost:8000")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_no_server_on_another_host_is_said_at_once_naming_the_url() -> None:
    """127.0.0.2 stands for another host: refused there is an answer, not a server still starting."""
    url = f"http://127.0.0.2:{closed_port()}"
    with pytest.raises(ConnectionError, match=f"nothing answers at {url}/ready") as refused:
        await OpenCodeEnv(base_url=url, connect_timeout_s=60).connect()
    assert "opencode-env serve" in str(refused.value)


async def test_no_server_on_this_machine_is_said_within_the_connect_timeout() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(ConnectionError, match=f"nothing answers at {url}/ready"):
        await OpenCodeEnv(base_url=url, connect_timeout_s=1).connect()
