"""Every tenant a fair share of what the server holds: two callers with two tokens on a real server on loopback (the
stub backend's sandboxes, which sleep), one of them hostile. Each test plays one of the floods that got through
before (request bodies of any size, one FIFO of rollout slots, one-shot calls and /step outside any quota, /ws
sessions capped only globally, results retained across callers) and checks that the honest caller's rollout and
results come through unaffected."""

from __future__ import annotations

import asyncio
import json
import socket
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.server.app import create_app
from opencode_env.server.auth import caller_token
from opencode_env.server.bodies import BodyLimit
from opencode_env.server.runs import REFUSED_KEPT
from opencode_env.server.runtime import Runtime
from opencode_env.server.session_quota import WebSocketSessions
from opencode_env.settings import Settings
from tests.stub_server import CountingBackend, stub_arguments

TOKEN = "operator-t0ken-for-share-tests"
HOSTILE, HONEST = caller_token(TOKEN, "hostile"), caller_token(TOKEN, "honest")
STREAM = {"accept": "application/json, text/event-stream"}
MIB = 2**20
pytestmark = pytest.mark.timeout(300)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@dataclass
class Served:
    url: str
    runtime: Runtime
    backend: CountingBackend
    app: Any


@contextmanager
def served(*, command_s: float = 0.0, max_rollouts: int = 2, **settings: Any) -> Iterator[Served]:
    backend = CountingBackend(command_s=command_s)
    configured = Settings.load().model_copy(
        update={"token": SecretStr(TOKEN), "upstream_allow": "127.0.0.1", **settings}
    )
    runtime = Runtime.build(configured, backend=backend, max_rollouts=max_rollouts)
    app = create_app(runtime)
    server = ThreadedServer(app)
    server.start()
    try:
        yield Served(server.url, runtime, backend, app)
    finally:
        server.stop()


def one_shot(task_id: str, **fields: Any) -> dict[str, Any]:
    params = {"name": "run_rollout", "arguments": {**stub_arguments(task_id), **fields}}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def step(task_id: str, **fields: Any) -> dict[str, Any]:
    arguments = {**stub_arguments(task_id), **fields}
    return {"action": {"type": "call_tool", "tool_name": "run_rollout", "arguments": arguments}}


async def until(condition: Any, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.05)


def test_bodies_past_the_limit_are_refused_on_every_route_before_parsing_and_never_echoed(tmp_path: Path) -> None:
    # A results directory of its own: the run's shared one lists what the other tests' servers recorded.
    with (
        served(max_body_mb=1, results_dir=str(tmp_path / "results")) as server,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        valid_but_huge = json.dumps({**stub_arguments("huge"), "instruction": "x" * (2 * MIB)}).encode()

        def streamed() -> Iterator[bytes]:
            for start in range(0, len(valid_but_huge), 64 * 1024):
                yield valid_but_huge[start : start + 64 * 1024]

        for path in ("/step", "/web/api/runs", "/mcp", "/reset", "/callers"):
            for body in (valid_but_huge, streamed()):
                answer = http.post(path, content=body, headers={**bearer(HOSTILE), **STREAM})
                assert answer.status_code == 413, (path, answer.status_code)
                assert "1 MiB" in answer.text
                assert "OPENCODE_ENV_MAX_BODY_MB" in answer.text
                assert len(answer.content) < 1000
        assert server.backend.created == 0
        assert http.get("/web/api/runs", headers=bearer(TOKEN)).json() == []

        # Under the limit but invalid: the 422 names the field and its limit, never the value.
        marker = "attacker-controlled-" * 20_000
        for path, body in (
            ("/web/api/runs", {**stub_arguments("bad"), "instruction": marker}),
            ("/web/api/runs", {**stub_arguments("bad"), "files": marker}),
            ("/step", {"action": marker}),
            ("/step", {"action": {"type": "call_tool", "tool_name": "run_rollout", "arguments": marker}}),
        ):
            answer = http.post(path, json=body, headers=bearer(HOSTILE))
            assert answer.status_code in (200, 422), (path, answer.status_code)
            assert "attacker-controlled" not in answer.text, path
            assert len(answer.content) < 2000, path


def test_nothing_of_a_refused_body_outlives_its_refusal() -> None:
    """Ten uploads streamed past the limit: the server's Python heap (the server runs in this process, in a thread)
    ends no larger than one body's worth, where a route handed a disconnect halfway kept each one's first MiB in a
    reference cycle until a full collection."""
    with served(max_body_mb=1) as server, httpx.Client(base_url=server.url, timeout=60) as http:

        def upload() -> Iterator[bytes]:
            yield b'{"action": "'
            for _ in range(3 * 16):
                yield b"x" * (64 * 1024)

        http.post("/step", content=upload(), headers=bearer(HOSTILE))
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for _ in range(10):
                assert http.post("/step", content=upload(), headers=bearer(HOSTILE)).status_code == 413
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert after - before < MIB, f"{(after - before) / MIB:.1f} MiB of refused bodies still held"


async def test_one_callers_uploads_in_flight_cannot_take_the_servers_memory_from_another() -> None:
    """The hostile caller opens uploads that never finish, each under the request limit; past its share its next
    body is refused 429 naming the setting, the honest caller's requests go through, and once the hostile's
    connections end its share is free again."""
    with served(max_body_mb=1, body_mb_per_caller=2) as server:
        host, port = server.url.removeprefix("http://").split(":")
        held: list[socket.socket] = []
        try:
            for _ in range(2):
                held.append(stalled_upload(host, int(port), HOSTILE, declared=MIB - 1024, sent=900 * 1024))
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                body = json.dumps(stub_arguments("one-more")).encode() + b" " * (400 * 1024)
                await until(lambda: sum(server_in_flight(server).values()) >= 1800 * 1024)
                refused = await http.post("/web/api/runs", content=body, headers=json_from(HOSTILE))
                assert refused.status_code == 429
                assert "OPENCODE_ENV_BODY_MB_PER_CALLER" in refused.text
                honest = await http.post("/web/api/runs", content=body, headers=json_from(HONEST))
                assert honest.status_code == 202, honest.text
                for connection in held:
                    connection.close()
                await until(lambda: not server_in_flight(server).get("caller:hostile"))
                again = await http.post("/web/api/runs", content=body, headers=json_from(HOSTILE))
                assert again.status_code == 202, again.text
        finally:
            for connection in held:
                connection.close()


def json_from(token: str) -> dict[str, str]:
    return {**bearer(token), "content-type": "application/json"}


def middleware(server: Served, kind: type[Any]) -> Any:
    app: Any = server.app.middleware_stack
    while app is not None and not isinstance(app, kind):
        app = getattr(app, "app", None)
    assert isinstance(app, kind)
    return app


def server_in_flight(server: Served) -> dict[str, int]:
    """What the server's body limit has charged to each caller."""
    return dict(middleware(server, BodyLimit).in_flight)


def stalled_upload(host: str, port: int, token: str, *, declared: int, sent: int) -> socket.socket:
    """A POST that declares `declared` bytes of body and sends only `sent` of them, then waits."""
    connection = socket.create_connection((host, port))
    head = (
        f"POST /web/api/runs HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: Bearer {token}\r\n"
        f"content-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
    )
    connection.sendall(head.encode() + b" " * sent)
    return connection


async def test_a_flood_of_queued_calls_on_every_transport_cannot_starve_another_callers_rollout() -> None:
    """The hostile caller queues 24 rollouts behind 2 slots (one-shot /mcp calls and /step, which open no session);
    the honest caller's rollout, given a budget shorter than the hostile's queue takes to drain, gets the next slot
    that frees: it ends as it ends alone, while the hostile still has calls waiting."""
    with served(command_s=0.5, max_rollouts=2) as server:
        slots = server.runtime.rollouts.slots
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            alone = await http.post("/step", json=step("alone"), headers=bearer(HONEST))
            alone_status = alone.json()["observation"]["result"]["data"]["status"]
            flood = [
                asyncio.ensure_future(
                    http.post("/mcp", json=one_shot(f"flood-{n}"), headers={**STREAM, **bearer(HOSTILE)})
                    if n % 2
                    else http.post("/step", json=step(f"flood-{n}"), headers=bearer(HOSTILE))
                )
                for n in range(24)
            ]
            await until(lambda: slots.waiting("caller:hostile") >= 20)
            created_before = server.backend.created
            honest = await http.post("/step", json=step("honest", total_timeout_s=60), headers=bearer(HONEST))
            observed = honest.json()["observation"]
            assert observed["error"] is None, observed
            assert observed["result"]["data"]["status"] == alone_status
            assert slots.waiting("caller:hostile") > 0, "the honest rollout waited for the hostile queue to drain"
            assert server.backend.created - created_before <= 4, "more than one round of hostile rollouts ran before it"
            await asyncio.gather(*flood)


async def test_a_callers_waiting_calls_past_its_share_are_refused_at_once_on_every_transport_and_kept_nowhere() -> None:
    with served(command_s=2.0, max_rollouts=1, queued_per_caller=3) as server:
        slots = server.runtime.rollouts.slots
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            held = [
                asyncio.ensure_future(http.post("/step", json=step(f"queued-{n}"), headers=bearer(HOSTILE)))
                for n in range(4)
            ]
            await until(lambda: slots.waiting("caller:hostile") == 3)
            over_mcp = await http.post("/mcp", json=one_shot("over"), headers={**STREAM, **bearer(HOSTILE)})
            assert over_mcp.status_code == 200
            assert '"isError":true' in over_mcp.text
            assert "OPENCODE_ENV_QUEUED_PER_CALLER" in over_mcp.text
            over_step = (await http.post("/step", json=step("over"), headers=bearer(HOSTILE))).json()["observation"]
            assert "OPENCODE_ENV_QUEUED_PER_CALLER" in over_step["error"]["message"]
            over_web = await http.post("/web/api/runs", json=stub_arguments("over"), headers=bearer(HOSTILE))
            assert over_web.status_code == 429
            assert "OPENCODE_ENV_QUEUED_PER_CALLER" in over_web.text
            async with OpenEnvSession(server.url, HOSTILE) as session:
                answer = await session.step(stub_arguments("over"))
                assert "OPENCODE_ENV_QUEUED_PER_CALLER" in json.dumps(answer)
            # The honest caller still queues; the operator is not counted.
            honest = asyncio.ensure_future(http.post("/step", json=step("honest"), headers=bearer(HONEST)))
            await until(lambda: slots.waiting("caller:honest") == 1)
            rows = (await http.get("/web/api/runs", headers=bearer(TOKEN))).json()
            assert not [row for row in rows if row["task_id"] == "over"], "a refused call was recorded"
            await asyncio.gather(*held, honest)


class OpenEnvSession:
    """OpenEnv's WebSocket session as its client speaks it: one `step` of run_rollout."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.replace("http", "ws") + "/ws"
        self.token = token

    async def __aenter__(self) -> OpenEnvSession:
        self.connection = await connect(self.url, additional_headers=bearer(self.token), proxy=None)
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.connection.close()

    async def step(self, arguments: dict[str, Any]) -> Any:
        action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": arguments}
        await self.connection.send(json.dumps({"type": "step", "data": action}))
        return json.loads(await self.connection.recv())


async def test_one_caller_holding_its_websockets_leaves_the_others_theirs() -> None:
    """At the default settings the hostile caller opens an MCP session, then /ws sessions until refused: it gets its
    share (OPENCODE_ENV_MCP_SESSIONS_PER_CALLER, both kinds counted together), well under the server's cap; the
    honest caller still opens a session and runs its rollout there; the hostile's share frees as it closes."""
    share = Settings.load().mcp_sessions_per_caller
    with served() as server:
        ws_url = server.url.replace("http", "ws") + "/ws"
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            opened = await http.post("/mcp", json=initialize(), headers={**STREAM, **bearer(HOSTILE)})
            assert opened.status_code == 200
            idle = [await connect(ws_url, additional_headers=bearer(HOSTILE), proxy=None) for _ in range(share - 1)]
            with pytest.raises(InvalidStatus) as refused:
                await connect(ws_url, additional_headers=bearer(HOSTILE), proxy=None)
            assert refused.value.response.status_code == 503
            assert b"OPENCODE_ENV_MCP_SESSIONS_PER_CALLER" in refused.value.response.body
            over_mcp = await http.post("/mcp", json=initialize(), headers={**STREAM, **bearer(HOSTILE)})
            assert over_mcp.status_code == 503
            async with OpenEnvSession(server.url, HONEST) as session:
                answer = await session.step(stub_arguments("honest"))
                assert answer["type"] == "observation", answer
                assert answer["data"]["observation"]["error"] is None
            await idle[0].close()
            quota = middleware(server, WebSocketSessions).quota
            await until(lambda: quota.websockets["caller:hostile"] == share - 2)
            async with OpenEnvSession(server.url, HOSTILE):
                pass
            for connection in idle[1:]:
                await connection.close()


def initialize() -> dict[str, Any]:
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "share-test", "version": "1"}}
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


async def test_another_callers_rollouts_and_instant_failures_never_evict_a_callers_results(tmp_path: Path) -> None:
    """Results kept 3 per caller: the honest caller's two stay listed and readable (from the results directory, after
    a restart too) through the hostile's five real rollouts and twice REFUSED_KEPT instant failures (a model URL
    nobody serves: refused before any sandbox); the failures are listed at most REFUSED_KEPT, written nowhere, and
    push out none of the hostile's own results."""
    results = tmp_path / "results"
    with served(results_dir=str(results), results_keep=3, max_rollouts=4) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            for n in range(2):
                await http.post("/step", json=step(f"honest-{n}"), headers=bearer(HONEST))
            for n in range(5):
                await http.post("/step", json=step(f"hostile-{n}"), headers=bearer(HOSTILE))
            nobody = "http://127.0.0.1:9/v1"
            await asyncio.gather(
                *(
                    http.post("/step", json=step(f"instant-{n}", base_url=nobody), headers=bearer(HOSTILE))
                    for n in range(2 * REFUSED_KEPT)
                )
            )
            honest_rows = (await http.get("/web/api/runs", headers=bearer(HONEST))).json()
            assert sorted(row["task_id"] for row in honest_rows) == ["honest-0", "honest-1"]
            for row in honest_rows:
                assert (await http.get(f"/web/api/runs/{row['id']}/result", headers=bearer(HONEST))).status_code == 200
            hostile_rows = (await http.get("/web/api/runs", headers=bearer(HOSTILE))).json()
            instant = [row for row in hostile_rows if row["task_id"].startswith("instant-")]
            assert len(instant) == REFUSED_KEPT
            assert all(row["status"] != "completed" for row in instant)
            kept = sorted(row["task_id"] for row in hostile_rows if row["task_id"].startswith("hostile-"))
            assert kept == ["hostile-2", "hostile-3", "hostile-4"]
    saved = {json.loads(row.read_text())["task_id"] for row in results.glob("**/*.run.json")}
    assert saved == {"honest-0", "honest-1", "hostile-2", "hostile-3", "hostile-4"}
    with served(results_dir=str(results), results_keep=3) as restarted, httpx.Client(base_url=restarted.url) as http:
        rows = http.get("/web/api/runs", headers=bearer(HONEST)).json()
        assert sorted(row["task_id"] for row in rows) == ["honest-0", "honest-1"]
