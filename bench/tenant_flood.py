"""An honest caller's rollouts with a hostile caller flooding the same server, side by side with the hostile absent.

    python -m bench.tenant_flood [N] [--slots 2] [--share 1]

The real server (`server.app`, local backend, a token, two caller tokens) in a process of its own. The honest
caller runs N real rollouts one after another (OpenCode driven by the scripted model: one bash step and an answer),
first alone, then while the hostile caller floods everything a caller can take:
- bodies: three 300 MB uploads at a time to /step, over and over (each cut at OPENCODE_ENV_MAX_BODY_MB);
- sessions: /ws sessions and MCP sessions opened until refused, held idle;
- slots: 40 one-shot /mcp rollouts queued whose setup sleeps 15 s then fails (a slot held at little CPU cost);
- instant failures: 200 rollouts toward a model URL nobody serves (refused before any sandbox).
Printed: the honest caller's success and latency (p50, p90) in each phase and their ratio, the server's peak RSS
in each phase, how long another caller's GET /health took meanwhile (p50, max), what the hostile got (status
counts), and whether the honest caller's results are all still listed and readable afterwards. `--slots` is
MAX_CONCURRENT_ENVS, `--share` OPENCODE_ENV_ROLLOUTS_PER_CALLER (0: none).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from bench.serving import free_port, running_server
from opencode_env import OpenCodeEnv
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import Script, bash, say
from opencode_env.server.auth import caller_token

TOKEN = "bench-operator-token-tenant-flood"
HOSTILE, HONEST = caller_token(TOKEN, "hostile"), caller_token(TOKEN, "honest")
STREAM = {"accept": "application/json, text/event-stream"}
NOBODY = "http://127.0.0.1:9/v1"
BODY_MB = 300


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Phase:
    def __init__(self, name: str) -> None:
        self.name = name
        self.latencies: list[float] = []
        self.statuses: list[str] = []
        self.peak_rss = 0.0
        self.health: list[float] = []


async def _honest(url: str, model: ScriptedModelServer, count: int, phase: Phase) -> None:
    async with OpenCodeEnv(url, token=HONEST, ready_timeout_s=300) as client:
        for n in range(count):
            started = time.monotonic()
            result = await client.run_rollout(
                instruction="Write hello.txt.",
                base_url=model.base_url,
                model="scripted",
                endpoint="vllm",
                task_id=f"honest-{phase.name}-{n}",
            )
            phase.latencies.append(time.monotonic() - started)
            phase.statuses.append(result.status)


async def _sample_rss(pid: int, phase: Phase, stop: asyncio.Event) -> None:
    while not stop.is_set():
        phase.peak_rss = max(phase.peak_rss, _rss_mb(pid))
        await asyncio.sleep(0.25)


async def _huge_body() -> AsyncIterator[bytes]:
    chunk = b'{"action": "' + b"x" * (2**20 - 12)
    for _ in range(BODY_MB):
        yield chunk


async def _flood_bodies(http: httpx.AsyncClient, stop: asyncio.Event, got: collections.Counter[str]) -> None:
    async def one() -> None:
        try:
            answer = await http.post("/step", content=_huge_body(), headers=_bearer(HOSTILE))
            got[f"body {answer.status_code}"] += 1
        except httpx.HTTPError as error:
            got[f"body {type(error).__name__}"] += 1

    while not stop.is_set():
        await asyncio.gather(one(), one(), one())


async def _flood_sessions(url: str, http: httpx.AsyncClient, got: collections.Counter[str]) -> list[ClientConnection]:
    held = []
    ws_url = url.replace("http", "ws") + "/ws"
    for _ in range(64):
        try:
            held.append(await connect(ws_url, additional_headers=_bearer(HOSTILE), proxy=None))
            got["ws opened"] += 1
        except InvalidStatus as refused:
            got[f"ws {refused.response.status_code}"] += 1
            break
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "flood", "version": "1"},
        },
    }
    for _ in range(64):
        answer = await http.post("/mcp", json=initialize, headers={**STREAM, **_bearer(HOSTILE)})
        got[f"mcp session {answer.status_code}"] += 1
        if answer.status_code != 200:
            break
    return held


async def _call(http: httpx.AsyncClient, arguments: dict[str, Any], got: collections.Counter[str], kind: str) -> None:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "run_rollout", "arguments": arguments},
    }
    try:
        answer = await http.post("/mcp", json=message, headers={**STREAM, **_bearer(HOSTILE)})
    except httpx.HTTPError as error:
        got[f"{kind} {type(error).__name__}"] += 1
        return
    text = answer.text
    status = (
        "refused (share)"
        if "PER_CALLER" in text
        else next(
            (word for word in ("setup_failed", "upstream_error", "invalid_request", "timeout") if word in text), "other"
        )
    )
    got[f"{kind} {status}"] += 1


async def _flood_slots(http: httpx.AsyncClient, model_url: str, got: collections.Counter[str]) -> None:
    holding = {
        "instruction": "hold a slot",
        "base_url": model_url,
        "model": "scripted",
        "mode": "black_box",
        "setup": ["sleep 15; false"],
        "total_timeout_s": 600,
    }
    await asyncio.gather(*(_call(http, {**holding, "task_id": f"slot-{n}"}, got, "slot") for n in range(40)))


async def _flood_instant(http: httpx.AsyncClient, got: collections.Counter[str]) -> None:
    failing = {"instruction": "fail", "base_url": NOBODY, "model": "m", "mode": "black_box"}
    for wave in range(10):
        await asyncio.gather(
            *(_call(http, {**failing, "task_id": f"instant-{wave}-{n}"}, got, "instant") for n in range(20))
        )


async def _hostile(url: str, model_url: str) -> None:
    """The hostile caller, in a process of its own (its uploads would otherwise slow the honest caller's own event
    loop): floods until its stdin closes, then prints what it got as JSON."""
    got: collections.Counter[str] = collections.Counter()
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900, connect=60)) as http:
        held = await _flood_sessions(url, http, got)
        flood = [
            asyncio.ensure_future(_flood_bodies(http, stop, got)),
            asyncio.ensure_future(_flood_slots(http, model_url, got)),
            asyncio.ensure_future(_flood_instant(http, got)),
        ]
        await asyncio.to_thread(sys.stdin.read)
        stop.set()
        for task in flood[1:]:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        for connection in held:
            await connection.close()
    print(json.dumps(dict(got)))


async def _probe_health(url: str, phase: Phase, stop: asyncio.Event) -> None:
    """How long another caller's smallest request takes meanwhile (the server's event loop stalling shows here)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while not stop.is_set():
            started = time.monotonic()
            await http.get("/health")
            phase.health.append(time.monotonic() - started)
            await asyncio.sleep(0.5)


async def _phase(url: str, pid: int, model: ScriptedModelServer, count: int, name: str, hostile: bool) -> Phase:
    phase = Phase(name)
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(_sample_rss(pid, phase, stop))
    probe = asyncio.ensure_future(_probe_health(url, phase, stop))
    flood = None
    if hostile:
        argv = [sys.executable, "-m", "bench.tenant_flood", "--hostile", url, model.base_url]
        flood = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        await asyncio.sleep(10)
    await _honest(url, model, count, phase)
    stop.set()
    if flood is not None:
        out, _ = await flood.communicate(b"")
        got = json.loads(out.decode().strip().splitlines()[-1])
        print(f"  hostile got: {', '.join(f'{key}: {value}' for key, value in sorted(got.items()))}")
    await asyncio.gather(sampler, probe)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        rows = (await http.get("/web/api/runs", headers=_bearer(HONEST))).json()
        mine = [row for row in rows if row["task_id"].startswith(f"honest-{name}-")]
        readable = [
            (await http.get(f"/web/api/runs/{row['id']}/result", headers=_bearer(HONEST))).status_code == 200
            for row in mine
        ]
    print(f"  honest results listed afterwards: {len(mine)}/{count}, readable {sum(readable)}/{len(mine)}")
    return phase


def _line(phase: Phase) -> str:
    ok = sum(status == "completed" for status in phase.statuses)
    ordered = sorted(phase.latencies)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"{phase.name:>15}: success {ok}/{len(phase.statuses)}  p50 {statistics.median(ordered):6.1f} s  "
        f"p90 {p90:6.1f} s  server peak RSS {phase.peak_rss:6.0f} MB  another caller's /health p50 "
        f"{statistics.median(phase.health) * 1000:6.0f} ms max {max(phase.health) * 1000:6.0f} ms"
    )


async def _run(count: int, slots: int, share: int) -> None:
    port = free_port()
    script = Script(steps=[bash("echo hello > hello.txt", "write a file"), say("done")])
    with ScriptedModelServer(script) as model, tempfile.TemporaryDirectory(prefix="tenant-flood-") as results:
        env = {
            **os.environ,
            "PORT": str(port),
            "HOST": "127.0.0.1",
            "OPENCODE_ENV_BACKEND": "local",
            "OPENCODE_ENV_TOKEN": TOKEN,
            "OPENCODE_ENV_UPSTREAM_ALLOW": "127.0.0.1",
            "MAX_CONCURRENT_ENVS": str(slots),
            "OPENCODE_ENV_ROLLOUTS_PER_CALLER": str(share),
            "OPENCODE_ENV_RESULTS_DIR": results,
        }
        argv = [sys.executable, "-m", "opencode_env.server.app"]
        with running_server(argv, f"http://127.0.0.1:{port}/ready", env=env, quiet=True) as pid:
            url = f"http://127.0.0.1:{port}"
            print(f"{count} honest rollouts per phase; {slots} slots, a caller's share {share or 'all'}")
            print("hostile absent:")
            alone = await _phase(url, pid, model, count, "absent", hostile=False)
            print("hostile flooding:")
            flooded = await _phase(url, pid, model, count, "flooding", hostile=True)
    print(_line(alone))
    print(_line(flooded))
    ratio = statistics.median(flooded.latencies) / statistics.median(alone.latencies)
    print(f"p50 flooding / absent: {ratio:.2f}; peak RSS flooding / absent: {flooded.peak_rss / alone.peak_rss:.2f}")


def main() -> None:
    if sys.argv[1:2] == ["--hostile"]:
        asyncio.run(_hostile(sys.argv[2], sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("count", nargs="?", type=int, default=4, help="honest rollouts per phase")
    parser.add_argument("--slots", type=int, default=2, help="MAX_CONCURRENT_ENVS")
    parser.add_argument("--share", type=int, default=1, help="OPENCODE_ENV_ROLLOUTS_PER_CALLER (0: none)")
    args = parser.parse_args()
    asyncio.run(_run(args.count, args.slots, args.share))


if __name__ == "__main__":
    main()
