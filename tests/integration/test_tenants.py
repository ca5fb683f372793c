"""Callers are tenants: on a server with a token each caller sees only the runs it started (the operator every run),
an MCP session serves only the credential that opened it; a server without a token is no way in for a web page
(cross-site requests and foreign Host names refused); MCP sessions are bounded in number and in what each keeps.

Each test tries the attack against a real server on loopback (the stub backend's sandboxes) and checks it fails."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from opencode_env.cli.app import main as cli_main
from opencode_env.client.by_reference import ResultFetchError, fetch_result
from opencode_env.client.client import OpenCodeEnv
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.app import create_app
from opencode_env.server.auth import caller_token
from opencode_env.server.mcp_endpoint import MAX_INITIALIZE_BYTES
from opencode_env.server.runtime import Runtime
from opencode_env.settings import Settings
from opencode_env.testing.stub_backend import StubBackend
from tests.integration.test_results_at_size import SizedRollouts, arguments, sized_result
from tests.stand_in import stand_in_server
from tests.stub_server import StubServer, stub_arguments, stub_server

TOKEN = "operator-t0ken-for-tenant-tests"
STREAM = {"accept": "application/json, text/event-stream"}
pytestmark = pytest.mark.timeout(180)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def tool_call(task_id: str) -> dict[str, Any]:
    params = {"name": "run_rollout", "arguments": stub_arguments(task_id)}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def initialize(client_info: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": client_info or {"name": "tenant-test", "version": "1"},
    }
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


@pytest.fixture(scope="module")
def shared() -> Iterator[StubServer]:
    with stub_server(command_s=0, token=TOKEN) as running:
        yield running


def issued(url: str, name: str) -> str:
    answer = httpx.post(f"{url}/callers", json={"name": name}, headers=bearer(TOKEN))
    assert answer.status_code == 200, answer.text
    token: str = answer.json()["token"]
    assert token == caller_token(TOKEN, name)
    return token


async def test_each_caller_sees_only_its_own_runs_and_the_operator_sees_all(shared: StubServer) -> None:
    alice, bob = issued(shared.url, "alice"), issued(shared.url, "bob")
    async with httpx.AsyncClient(base_url=shared.url, timeout=60) as http:
        # alice over the standard MCP transport, bob over OpenEnv's WebSocket, and bob's own /web form run.
        called = await http.post("/mcp", json=tool_call("alices-task"), headers={**STREAM, **bearer(alice)})
        assert called.status_code == 200
        async with OpenCodeEnv(shared.url, token=bob) as env:
            await env.call_tool("run_rollout", **stub_arguments("bobs-task"))
        form = await http.post("/web/api/runs", json=stub_arguments("bobs-form"), headers=bearer(bob))
        assert form.status_code == 202

        async def listed(token: str) -> dict[str, str]:
            rows = (await http.get("/web/api/runs", headers=bearer(token))).json()
            return {row["task_id"]: row["id"] for row in rows if row["state"] == "finished"}

        mine = {"alices-task", "bobs-task", "bobs-form"}
        assert await wait_until_async(lambda: listed(TOKEN), lambda rows: mine <= set(rows))
        everyone = await listed(TOKEN)
        assert set(await listed(alice)) == {"alices-task"}
        assert set(await listed(bob)) == {"bobs-task", "bobs-form"}

        for task, owner, stranger in (("alices-task", alice, bob), ("bobs-task", bob, alice)):
            run_id = everyone[task]
            for route in (f"/web/api/runs/{run_id}", f"/web/api/runs/{run_id}/result"):
                assert (await http.get(route, headers=bearer(stranger))).status_code == 404, route
                assert (await http.get(route, headers=bearer(owner))).status_code == 200, route
                assert (await http.get(route, headers=bearer(TOKEN))).status_code == 200, route
            training = await http.get(f"/web/api/runs/{run_id}/training", headers=bearer(stranger))
            assert training.status_code == 404
        others = (await http.get("/web/api/server", headers=bearer(alice))).json()["others"]
        assert others["rows"] == 0


async def wait_until_async(read: Any, holds: Any, timeout_s: float = 60.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if holds(await read()):
            return True
        await asyncio.sleep(0.1)
    return False


def test_only_the_operator_issues_caller_tokens_and_a_forged_one_is_refused(shared: StubServer) -> None:
    alice = issued(shared.url, "alice")
    refused = httpx.post(f"{shared.url}/callers", json={"name": "mallory"}, headers=bearer(alice))
    assert refused.status_code == 403
    bad_name = httpx.post(f"{shared.url}/callers", json={"name": "a.b"}, headers=bearer(TOKEN))
    assert bad_name.status_code == 422
    # alice's MAC under bob's name, a token of another server's operator, and alice's with a changed character.
    mac = alice.rsplit(".", 1)[1]
    for forged in (
        f"occ1.bob.{mac}",
        caller_token("another-server", "bob"),
        alice[:-1] + ("A" if alice[-1] != "A" else "B"),
    ):
        answer = httpx.get(f"{shared.url}/web/api/runs", headers=bearer(forged))
        assert answer.status_code == 401, forged
        assert "OPENCODE_ENV_TOKEN" in answer.json()["error"]


def test_a_withdrawn_caller_is_refused_and_never_issued_again_while_the_others_stay(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A caller token cannot be deleted (it is derived, not stored): naming the caller in
    OPENCODE_ENV_REVOKED_CALLERS refuses its valid token everywhere and stops POST /callers and the CLI issuing it
    again; another caller's token, derived offline by `opencode-env caller-token`, still serves."""
    monkeypatch.setenv("OPENCODE_ENV_REVOKED_CALLERS", "mallory, eve")
    with stub_server(command_s=0, token=TOKEN) as running:
        for path in ("/web/api/runs", "/mcp"):
            answer = httpx.get(f"{running.url}{path}", headers=bearer(caller_token(TOKEN, "mallory")))
            assert answer.status_code == 401, path
            assert "withdrawn (OPENCODE_ENV_REVOKED_CALLERS)" in answer.text
        reissued = httpx.post(f"{running.url}/callers", json={"name": "eve"}, headers=bearer(TOKEN))
        assert (reissued.status_code, "withdrawn" in reissued.text) == (409, True)
        monkeypatch.setenv("OPENCODE_ENV_TOKEN", TOKEN)
        assert cli_main(["caller-token", "mallory"]) == 2
        assert cli_main(["caller-token", "alice"]) == 0
        derived = capsys.readouterr().out.strip()
        assert derived == issued(running.url, "alice")
        assert httpx.get(f"{running.url}/web/api/runs", headers=bearer(derived)).status_code == 200


def test_an_mcp_session_serves_only_the_caller_that_opened_it(shared: StubServer) -> None:
    alice, bob = issued(shared.url, "alice"), issued(shared.url, "bob")
    with httpx.Client(base_url=shared.url, timeout=60) as http:
        opened = http.post("/mcp", json=initialize(), headers={**STREAM, **bearer(alice)})
        assert opened.status_code == 200
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        assert http.post("/mcp", json=listing, headers={**STREAM, **session, **bearer(bob)}).status_code == 404
        assert http.post("/mcp", json=listing, headers={**STREAM, **session, **bearer(alice)}).status_code == 200


@pytest.fixture(scope="module")
def open_locally() -> Iterator[StubServer]:
    with stub_server(command_s=0, token="") as running:
        yield running


def test_without_a_token_a_cross_site_page_cannot_post_to_mcp(open_locally: StubServer) -> None:
    url, port = open_locally.url, open_locally.url.rsplit(":", 1)[1]
    body = json.dumps(tool_call("csrf"))
    attacks = {
        "a cross-site text/plain POST": {"content-type": "text/plain", "origin": "https://evil.example"},
        "the same as JSON (a CORS preflight the page never gets)": {
            "content-type": "application/json",
            "origin": "https://evil.example",
            **STREAM,
        },
        "a sandboxed frame (Origin: null)": {"content-type": "text/plain", "origin": "null"},
        "a browser that omits Origin on a form post": {"content-type": "application/x-www-form-urlencoded"},
        "a cross-site request by Sec-Fetch-Site": {"content-type": "text/plain", "sec-fetch-site": "cross-site"},
        "another port of this machine (same site, other origin)": {
            "content-type": "text/plain",
            "origin": "http://127.0.0.1:1",
        },
    }
    for attack, headers in attacks.items():
        for path in ("/mcp", "/step", "/web/api/runs"):
            answer = httpx.post(f"{url}{path}", content=body, headers=headers)
            assert answer.status_code in (403, 415), (attack, path, answer.status_code)
            assert "no token" in answer.text, (attack, path)
    assert open_locally.backend.created == 0
    # The server's own page (same origin, JSON) and programs without an Origin are served.
    own = {"origin": f"http://127.0.0.1:{port}", "sec-fetch-site": "same-origin", **STREAM}
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert httpx.post(f"{url}/mcp", json=listing, headers=own).status_code == 200
    assert httpx.post(f"{url}/mcp", json=listing, headers=STREAM).status_code == 200
    # Callers cannot be told apart without a token: no caller token is issued.
    assert httpx.post(f"{url}/callers", json={"name": "alice"}).status_code == 409


def test_without_a_token_a_foreign_host_name_is_refused(open_locally: StubServer) -> None:
    url, port = open_locally.url, open_locally.url.rsplit(":", 1)[1]
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for host in (f"evil.example:{port}", "rebind.attacker.test", f"127.0.0.1.nip.io:{port}"):
        for path in ("/mcp", "/metadata", "/web/api/runs", f"/results/{'A' * 43}"):
            answer = httpx.post(f"{url}{path}", json=listing, headers={**STREAM, "host": host})
            if path != "/mcp":
                answer = httpx.get(f"{url}{path}", headers={"host": host})
            assert answer.status_code == 403, (host, path)
            assert "DNS rebinding" in answer.text
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"app.localhost:{port}"):
        assert httpx.get(f"{url}/metadata", headers={"host": host}).status_code == 200, host


async def test_without_a_token_a_cross_site_websocket_is_refused(open_locally: StubServer) -> None:
    ws_url = open_locally.url.replace("http", "ws") + "/ws"
    for origin in ("https://evil.example", "null"):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(ws_url, origin=origin, proxy=None):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 403
    async with connect(ws_url, proxy=None) as ws:
        await ws.send(json.dumps({"type": "close"}))


def test_a_server_without_a_token_says_at_start_what_it_admits(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings.load().model_copy(update={"allowed_hosts": "gpu-box.lan", "space_host": "me-env.hf.space"})
    with caplog.at_level(logging.INFO, logger="opencode_env.server"):
        create_app(Runtime.build(settings, backend=StubBackend(command_s=0)))
    said = caplog.text
    assert "browsers are served only from this server's own pages" in said
    assert "gpu-box.lan" in said
    assert "me-env.hf.space" in said
    assert "localhost" in said


@pytest.fixture
def few_sessions() -> Iterator[str]:
    settings = Settings.load().model_copy(update={"mcp_sessions": 3})
    server = ThreadedServer(create_app(Runtime.build(settings, backend=StubBackend(command_s=0))))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_mcp_sessions_are_bounded_in_number_and_in_what_each_keeps(few_sessions: str) -> None:
    with httpx.Client(base_url=few_sessions, timeout=60) as http:
        huge = initialize({"name": "x" * 2**20, "version": "1"})
        refused = http.post("/mcp", json=huge, headers=STREAM)
        assert refused.status_code == 413
        assert str(MAX_INITIALIZE_BYTES) in refused.json()["error"]["message"]
        assert "clientInfo" in refused.json()["error"]["message"]
        opened = [http.post("/mcp", json=initialize(), headers=STREAM) for _ in range(3)]
        assert [answer.status_code for answer in opened] == [200, 200, 200]
        assert http.post("/mcp", json=initialize(), headers=STREAM).status_code == 503
        # Closing one (DELETE) makes room for the next.
        session = {"mcp-session-id": opened[0].headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        assert http.delete("/mcp", headers=session).status_code in (200, 204)
        assert wait_until_sync(lambda: http.post("/mcp", json=initialize(), headers=STREAM).status_code == 200)


def test_one_caller_cannot_take_every_mcp_session_from_the_others() -> None:
    """A caller token holds at most its share of sessions, concurrent openings counted: past it 503 naming the
    setting; another caller and the operator still open theirs; ending one makes room again."""
    settings = Settings.load().model_copy(
        update={"mcp_sessions": 10, "mcp_sessions_per_caller": 2, "token": SecretStr(TOKEN)}
    )
    server = ThreadedServer(create_app(Runtime.build(settings, backend=StubBackend(command_s=0))))
    server.start()
    try:
        alice, bob = caller_token(TOKEN, "alice"), caller_token(TOKEN, "bob")
        with httpx.Client(base_url=server.url, timeout=60) as http:

            def opening(token: str) -> httpx.Response:
                return http.post("/mcp", json=initialize(), headers={**STREAM, **bearer(token)})

            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                burst = list(pool.map(opening, [alice] * 6))
            assert sorted(answer.status_code for answer in burst) == [200, 200, 503, 503, 503, 503]
            refused = next(answer for answer in burst if answer.status_code == 503)
            assert "OPENCODE_ENV_MCP_SESSIONS_PER_CALLER" in refused.json()["error"]["message"]
            assert [opening(bob).status_code, opening(TOKEN).status_code, opening(TOKEN).status_code] == [200] * 3
            assert opening(alice).status_code == 503
            first = next(answer for answer in burst if answer.status_code == 200)
            session = {"mcp-session-id": first.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
            assert http.delete("/mcp", headers={**session, **bearer(alice)}).status_code in (200, 204)
            assert wait_until_sync(lambda: opening(alice).status_code == 200)
    finally:
        server.stop()


def wait_until_sync(condition: Any, tries: int = 50) -> bool:
    for _ in range(tries):
        if condition():
            return True
        time.sleep(0.1)
    return False


async def test_a_caller_token_reads_its_own_result_by_reference_and_nothing_else_does() -> None:
    """OpenCodeEnv with a caller's token gets the whole result by its reference; without a credential the same
    reference is refused, and a wrong credential never reaches the tool."""
    result = sized_result(2_000)
    with stand_in_server(SizedRollouts(result), TOKEN) as served:
        alice = caller_token(TOKEN, "alice")
        async with OpenCodeEnv(served, token=alice) as env:
            whole = await env.run_rollout(**arguments())
            answer = await env.call_tool("run_rollout", **arguments())
        assert [turn.completion_token_ids for turn in whole.proxy_turns] == [
            turn.completion_token_ids for turn in result.proxy_turns
        ]
        assert answer["result"] is None, "a result this size travels by reference only"
        with pytest.raises(ResultFetchError, match="HTTP 401"):
            await fetch_result(served, answer)
        with pytest.raises(ConnectionError, match="caller token"):
            async with OpenCodeEnv(served, token=caller_token("another-server", "alice")) as env:
                await env.run_rollout(**arguments())
