"""Servers that share one results directory (every server of one user does): each /web lists its own rollouts (and
those of an earlier server at its address: itself, restarted), counts the others by address without serving them,
and each row names the server that ran it, as that server recorded it, whatever the rollout's own contents say."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from opencode_env.server.result_store import ResultsDir
from opencode_env.server.runs import Run, Runs, ServerOrigin
from opencode_env.viewer.rows import OPERATOR
from opencode_env.viewer.web import web_router
from opencode_env.wire import RolloutRequest, RolloutResult
from tests.integration.test_shutdown import free_port

pytestmark = pytest.mark.timeout(600)


async def finished(runs: Runs, task_id: str, **fields: Any) -> Run:
    run = runs.begin(RolloutRequest(instruction=fields.pop("instruction", "go"), task_id=task_id, **fields))
    await runs.finish(run, RolloutResult(task_id=task_id, reward=1.0, reward_source="reward_txt"))
    return run


def client_of(runs: Runs) -> httpx.AsyncClient:
    app = FastAPI()

    async def never(request: RolloutRequest, run: Run) -> RolloutResult:
        raise AssertionError("nothing is started from this page")

    app.include_router(web_router(runs, lambda request, caller: runs.start(request, never, caller), lambda _: OPERATOR))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://web.test")


async def test_two_stores_on_one_directory_each_list_their_own(tmp_path: Path) -> None:
    here, there = ServerOrigin.this_process("127.0.0.1:8001"), ServerOrigin.this_process("127.0.0.1:8002")
    first = Runs(results=ResultsDir(tmp_path), origin=here)
    second = Runs(results=ResultsDir(tmp_path), origin=there)
    mine = await finished(first, "first-server")
    theirs = await finished(second, "second-server")
    assert [view.task_id for view in first.views()] == ["first-server"]
    assert [view.task_id for view in second.views()] == ["second-server"]
    assert (await first.others()).addresses == {"127.0.0.1:8002": 1}
    async with client_of(first) as client:
        assert (await client.get(f"/web/api/runs/{theirs.view.id}/result")).status_code == 404
        assert (await client.get(f"/web/api/runs/{theirs.view.id}")).status_code == 404
        assert (await client.get(f"/web/api/runs/{mine.view.id}/result")).status_code == 200
        server = (await client.get("/web/api/server")).json()
    assert server["origin"]["instance"] == here.instance
    assert server["others"] == {"rows": 1, "addresses": {"127.0.0.1:8002": 1}, "unknown": 0}

    restarted = Runs(results=ResultsDir(tmp_path), origin=ServerOrigin.this_process("127.0.0.1:8001"))
    [earlier] = restarted.views()
    assert earlier.id == mine.view.id
    assert earlier.server == here
    assert earlier.server.instance != restarted.origin.instance
    assert await restarted.result_json(mine.view.id) is not None
    assert await restarted.result_json(theirs.view.id) is None


async def test_a_row_of_an_older_version_is_counted_as_unknown_and_not_listed(tmp_path: Path) -> None:
    old = Runs(results=ResultsDir(tmp_path), origin=ServerOrigin.this_process("127.0.0.1:8001"))
    run = await finished(old, "older")
    row = tmp_path / f"{run.view.id}.run.json"
    saved = json.loads(row.read_text())
    del saved["server"]
    row.write_text(json.dumps(saved))
    later = Runs(results=ResultsDir(tmp_path), origin=ServerOrigin.this_process("127.0.0.1:8001"))
    assert later.views() == []
    assert (await later.others()).unknown == 1


async def test_a_rollout_cannot_claim_another_server(tmp_path: Path) -> None:
    """The attack: a rollout whose every field the caller or the agent sets (task id, instruction, the result's
    error and warnings) spells out the other server's origin as JSON. The row keeps the server that ran it."""
    here, there = ServerOrigin.this_process("127.0.0.1:8001"), ServerOrigin.this_process("127.0.0.1:8002")
    forged = json.dumps({"server": there.model_dump(), **there.model_dump()})
    runs = Runs(results=ResultsDir(tmp_path), origin=here)
    run = runs.begin(RolloutRequest(instruction=forged, task_id="forged"))
    claim = RolloutResult(task_id="forged", error=forged, warnings=[forged], status="agent_error", sandbox_id="box-1")
    await runs.finish(run, claim)
    row = json.loads((tmp_path / f"{run.view.id}.run.json").read_text())
    assert row["server"] == json.loads(here.model_dump_json())
    other = Runs(results=ResultsDir(tmp_path), origin=there)
    assert other.views() == []
    assert (await other.others()).addresses == {"127.0.0.1:8001": 1}
    with pytest.raises(ValueError, match="server"):
        RolloutRequest.model_validate({"instruction": "go", "server": there.model_dump()})


class ServerProcess:
    """A server on `port` with the results directory shared: `python -m opencode_env.server.app` told its port by
    the PORT setting, or `opencode-env serve --port` (whose flags must reach what the server records, not the
    defaults)."""

    def __init__(self, port: int, results: Path, log: Path, sandboxes: Path, *, by_flag: bool = False) -> None:
        env = {
            **os.environ,
            "OPENCODE_ENV_BACKEND": "local",
            "TMPDIR": str(sandboxes),
            "OPENCODE_ENV_RESULTS_DIR": str(results),
        }
        for name in ("OPENCODE_ENV_TOKEN", "HOST", "PORT"):
            env.pop(name, None)
        if by_flag:
            command = ["-m", "opencode_env.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        else:
            command = ["-m", "opencode_env.server.app"]
            env.update({"HOST": "127.0.0.1", "PORT": str(port)})
        self.url = f"http://127.0.0.1:{port}"
        self.log = log.open("ab")
        self.process = subprocess.Popen([sys.executable, *command], env=env, stdout=self.log, stderr=self.log)

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the server exited"
            try:
                if httpx.get(f"{self.url}/metadata", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.url} never became ready")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Path, list[ServerProcess]]]:
    started: list[ServerProcess] = []
    yield tmp_path, started
    for server in started:
        server.stop()


def oracle(task_id: str) -> dict[str, Any]:
    return {
        "instruction": "Write 42 to answer.txt",
        "solution": ["echo 42 > /home/user/workdir/answer.txt"],
        "verify": ['cd /home/user/workdir && test "$(cat answer.txt)" = 42'],
        "task_id": task_id,
    }


async def run_on(server: ServerProcess, task_id: str) -> str:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        started = await http.post("/web/api/runs", json=oracle(task_id))
        assert started.status_code == 202, started.text
        run_id: str = started.json()["id"]
        for _ in range(1200):
            view = (await http.get(f"/web/api/runs/{run_id}")).json()
            if view["state"] != "running":
                assert (view["state"], view["reward"]) == ("finished", 1.0), view
                return run_id
            await asyncio.sleep(0.25)
    raise AssertionError(f"{task_id} never finished")


async def test_two_real_servers_sharing_a_results_directory(shared: tuple[Path, list[ServerProcess]]) -> None:
    root, started = shared
    results, sandboxes = root / "results", root / "sandboxes"
    sandboxes.mkdir()
    ports = free_port(), free_port()
    first = ServerProcess(ports[0], results, root / "first.log", sandboxes)
    second = ServerProcess(ports[1], results, root / "second.log", sandboxes, by_flag=True)
    started += [first, second]
    await asyncio.gather(asyncio.to_thread(first.wait_ready), asyncio.to_thread(second.wait_ready))
    first_id, second_id = await asyncio.gather(run_on(first, "on-first"), run_on(second, "on-second"))

    async with httpx.AsyncClient(timeout=30) as http:
        for server, own, other in ((first, "on-first", second_id), (second, "on-second", first_id)):
            listed = (await http.get(f"{server.url}/web/api/runs")).json()
            assert [row["task_id"] for row in listed] == [own]
            about = (await http.get(f"{server.url}/web/api/server")).json()
            assert listed[0]["server"] == about["origin"]
            assert about["origin"]["pid"] == server.process.pid
            assert about["origin"]["address"] == server.url.removeprefix("http://")
            other_address = (second if server is first else first).url.removeprefix("http://")
            assert about["others"]["addresses"] == {other_address: 1}
            assert (await http.get(f"{server.url}/web/api/runs/{other}/result")).status_code == 404

    first.stop()
    again = ServerProcess(ports[0], results, root / "server-again.log", sandboxes)
    started.append(again)
    await asyncio.to_thread(again.wait_ready)
    async with httpx.AsyncClient(timeout=30) as http:
        [earlier] = (await http.get(f"{again.url}/web/api/runs")).json()
        about = (await http.get(f"{again.url}/web/api/server")).json()
        assert (earlier["id"], earlier["server"]["pid"]) == (first_id, first.process.pid)
        assert earlier["server"]["instance"] != about["origin"]["instance"]
        assert (await http.get(f"{again.url}/web/api/runs/{first_id}/result")).status_code == 200
