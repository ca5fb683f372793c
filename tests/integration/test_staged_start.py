"""The served app answers /health from its first moment; other requests wait for it (a bounded time, then hear
that it is starting), or hear why it failed."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from opencode_env.client.client import OpenCodeEnv
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.staged import StagedApp
from opencode_env.testing.stub_backend import StubBackend
from tests.server_app import app_for


def wait_for_status(url: str, status: int, timeout_s: float = 30) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(url)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def build_once_released(release: threading.Event) -> Callable[[], Any]:
    """A build of the real app on the stub backend that takes until `release` is set."""

    def slow_build() -> Any:
        release.wait(60)
        return app_for(StubBackend(), token="")

    return slow_build


async def test_health_answers_while_the_app_is_built_and_the_rest_waits_for_it() -> None:
    release = threading.Event()
    slow_build = build_once_released(release)
    server = ThreadedServer(StagedApp(slow_build))
    server.start()
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await http.get(f"{server.url}/health")).status_code == 200
            starting = await http.get(f"{server.url}/ready")
            assert (starting.status_code, starting.headers["retry-after"]) == (503, "2")
            waiting = asyncio.ensure_future(http.get(f"{server.url}/metadata"))
            listing = asyncio.ensure_future(_tool_names(server.url))
            await asyncio.sleep(1.0)
            assert not waiting.done()
            assert not listing.done()
            release.set()
            assert (await waiting).json()["backend"] == "stub"
            assert (await http.get(f"{server.url}/ready")).json() == {"status": "ready"}
        assert await listing == ["run_rollout"]
    finally:
        release.set()
        server.stop()


async def _tool_names(url: str) -> list[str]:
    async with OpenCodeEnv(url) as env:
        return [tool.name for tool in await env.list_tools()]


async def test_a_request_that_waits_too_long_hears_that_the_server_is_starting() -> None:
    release = threading.Event()
    slow_build = build_once_released(release)
    server = ThreadedServer(StagedApp(slow_build, ready_wait_s=0.3))
    server.start()
    try:
        async with httpx.AsyncClient() as http:
            starting = await http.get(f"{server.url}/metadata")
        assert starting.status_code == 503
        assert "starting" in starting.json()["error"]
        assert starting.headers["retry-after"] == "2"
        with pytest.raises(ConnectionError, match="still starting after 1 s"):
            async with OpenCodeEnv(server.url, ready_timeout_s=1) as env:
                await env.list_tools()
    finally:
        release.set()
        server.stop()


async def test_our_client_waits_for_a_loading_server_beyond_its_hold_and_its_connect_timeout() -> None:
    """The server holds a request 0.3 s, the client's connect timeout is 0.5 s, the build takes 3 s: the client asks
    /ready as its Retry-After says and calls once the tool can be called."""
    release = threading.Event()
    server = ThreadedServer(StagedApp(build_once_released(release), ready_wait_s=0.3))
    server.start()
    try:
        threading.Timer(3.0, release.set).start()
        async with OpenCodeEnv(server.url, connect_timeout_s=0.5, ready_timeout_s=60) as env:
            assert release.is_set()
            assert [tool.name for tool in await env.list_tools()] == ["run_rollout"]
    finally:
        release.set()
        server.stop()


async def test_our_client_hears_at_once_why_a_server_could_not_start() -> None:
    def broken_build() -> Any:
        raise RuntimeError("E2B_API_KEY is malformed")

    server = ThreadedServer(StagedApp(broken_build))
    server.start()
    try:
        wait_for_status(f"{server.url}/health", 503)
        with pytest.raises(ConnectionError, match="E2B_API_KEY is malformed"):
            async with OpenCodeEnv(server.url, ready_timeout_s=60) as env:
                await env.list_tools()
    finally:
        server.stop()


def test_a_build_that_fails_is_explained_on_every_route() -> None:
    def broken_build() -> Any:
        raise RuntimeError("E2B_API_KEY is malformed")

    server = ThreadedServer(StagedApp(broken_build))
    server.start()
    try:
        failed = wait_for_status(f"{server.url}/health", 503)
        assert "E2B_API_KEY is malformed" in failed.json()["error"]
        assert "E2B_API_KEY is malformed" in httpx.get(f"{server.url}/mcp").json()["error"]
        not_ready = httpx.get(f"{server.url}/ready")
        assert not_ready.status_code == 503
        assert "E2B_API_KEY is malformed" in not_ready.json()["error"]
    finally:
        server.stop()


def test_the_built_hook_runs_once_after_the_build() -> None:
    order: list[str] = []

    def build() -> Any:
        app = app_for(StubBackend(), token="")
        order.append("built")
        return app

    server = ThreadedServer(StagedApp(build, built=lambda: order.append("hook")))
    server.start()
    try:
        assert wait_for_status(f"{server.url}/metadata", 200).status_code == 200
        assert order == ["built", "hook"]
    finally:
        server.stop()


async def test_a_client_with_no_server_to_talk_to_is_told_how_to_start_one() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match="Start one with `opencode-env serve`"):
        async with OpenCodeEnv(f"http://127.0.0.1:{port}") as env:
            await env.list_tools()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_our_client_started_before_its_server_waits_for_the_port_within_its_ready_budget() -> None:
    """A script that starts `opencode-env serve` and its client together: refused connections are "not yet"."""
    port = free_port()
    server = ThreadedServer(StagedApp(lambda: app_for(StubBackend(), token="")), port=port)
    starter = threading.Timer(2.0, server.start)
    starter.start()
    try:
        async with OpenCodeEnv(f"http://127.0.0.1:{port}", ready_timeout_s=60) as env:
            assert [tool.name for tool in await env.list_tools()] == ["run_rollout"]
    finally:
        starter.join()
        server.stop()


async def test_our_client_with_no_server_says_nothing_answers_once_its_ready_budget_is_spent() -> None:
    with pytest.raises(ConnectionError, match="nothing answers at"):
        async with OpenCodeEnv(f"http://127.0.0.1:{free_port()}", ready_timeout_s=1) as env:
            await env.list_tools()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_a_script_waits_for_the_server_with_curl_as_the_docs_show() -> None:
    """docs/results.md: `curl -sf --retry 60 --retry-connrefused --retry-delay 1 <url>/ready` returns once the tool
    can be called, through refused connections (port not bound yet) and 503s (app still loading)."""
    port = free_port()
    release = threading.Event()
    server = ThreadedServer(StagedApp(build_once_released(release)), port=port)
    threading.Timer(1.5, server.start).start()
    threading.Timer(4.0, release.set).start()
    try:
        command = ["curl", "-sf", "--retry", "60", "--retry-connrefused", "--retry-delay", "1"]
        done = subprocess.run(
            [*command, f"http://127.0.0.1:{port}/ready"], capture_output=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        assert release.is_set()
        assert json.loads(done.stdout) == {"status": "ready"}
    finally:
        release.set()
        time.sleep(0.1)
        server.stop()
