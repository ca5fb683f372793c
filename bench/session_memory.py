"""The server's memory under abandoned MCP sessions and over many rollouts: the real app (`server.app.create_app`,
every transport, the stub backend's sandboxes) under uvicorn in a process of its own, its RSS read from /proc.

1. Abandoned sessions: each an `initialize` with a 1 MiB `clientInfo`, never used again (no DELETE), one after
   another; then the same with a small clientInfo (sessions admitted until the cap, the rest refused). Run against
   this server's bounds and, side by side, against the MCP SDK's defaults (10,000 sessions, 30 min idle, any
   clientInfo): the "before" (fewer sessions there, since each keeps its megabyte).
2. Rollouts: N through OpenCodeEnv over /ws (each answer, then its result read back by reference), the stub
   backend's sandboxes; RSS at 0, N/2 and N.

    uv run --frozen python -m bench.session_memory [--sessions 1000] [--before-sessions 200] [--rollouts 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import httpx

STREAM = {"accept": "application/json, text/event-stream"}
MIB = 2**20


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _serve(port: int, sdk_defaults: bool) -> None:
    import uvicorn

    from opencode_env.server import mcp_endpoint
    from opencode_env.server.app import UVICORN_OPTIONS, create_app
    from opencode_env.server.runtime import Runtime
    from opencode_env.settings import Settings
    from opencode_env.testing.stub_backend import StubBackend

    settings = Settings.load()
    if sdk_defaults:
        settings = settings.model_copy(update={"mcp_sessions": 10_000, "mcp_session_idle_s": 1800.0})
        mcp_endpoint.MAX_INITIALIZE_BYTES = mcp_endpoint.MAX_READ_BODY_BYTES
    app = create_app(Runtime.build(settings, backend=StubBackend(command_s=0), keep_results=False))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", **UVICORN_OPTIONS)


def _initialize(client_name_bytes: int) -> dict[str, Any]:
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "x" * client_name_bytes, "version": "1"},
    }
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


async def _ready(url: str) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(240):
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} never became ready")


async def _abandon(url: str, count: int, name_bytes: int) -> dict[int, int]:
    """`count` sessions opened and left; the status codes the server answered, counted."""
    statuses: dict[int, int] = {}
    body = _initialize(name_bytes)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(count):
            answer = await http.post("/mcp", json=body, headers=STREAM)
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
    return statuses


async def _sessions(sessions: int, sdk_defaults: bool) -> list[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.session_memory", "--serve", str(port), "sdk" if sdk_defaults else "ours"]
    server = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL)
    try:
        await _ready(url)
        start = _rss_mb(server.pid)
        big = await _abandon(url, sessions, MIB)
        after_big = _rss_mb(server.pid)
        small = await _abandon(url, sessions, 16)
        after_small = _rss_mb(server.pid)
    finally:
        server.terminate()
        await server.wait()
    label = "the MCP SDK's defaults" if sdk_defaults else "this server's bounds"
    return [
        f"{label}: RSS {start:.0f} MB at start; {after_big:.0f} MB after {sessions} abandoned sessions with a 1 MiB "
        f"clientInfo (+{after_big - start:.0f} MB, {(after_big - start) / sessions * 1024:.0f} KiB each; answers "
        f"{big}); {after_small:.0f} MB after {sessions} more with a small one (answers {small})"
    ]


async def _rollouts(count: int) -> str:
    from opencode_env.client.client import OpenCodeEnv
    from opencode_env.scripted.model import ScriptedModelServer
    from opencode_env.scripted.script import demo_script

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.session_memory", "--serve", str(port), "ours"]
    server = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL)
    marks: dict[int, float] = {}
    # the model each request names: the server probes it before its first rollout (the stub's sandboxes never call it)
    with ScriptedModelServer(demo_script()) as model:
        arguments = {
            "instruction": "x",
            "base_url": model.base_url,
            "model": "m",
            "mode": "black_box",
            "setup": ["sleep"],
        }
        try:
            await _ready(url)
            marks[0] = _rss_mb(server.pid)
            async with OpenCodeEnv(url) as env:
                for done in range(1, count + 1):
                    result = await env.run_rollout(**arguments, task_id=f"r{done}")
                    if not result.sandbox_id:
                        raise RuntimeError(f"a rollout ended before its sandbox: {result.status} {result.error}")
                    marks[done] = _rss_mb(server.pid)
        finally:
            server.terminate()
            await server.wait()
    half = count // 2
    return (
        f"{count} rollouts (stub backend, over /ws, each result read back by reference): RSS "
        f"{marks[0]:.0f} / {marks[half]:.0f} / {marks[count]:.0f} MB after 0 / {half} / {count}; "
        f"{(marks[count] - marks[half]) / max(count - half, 1) * 1024:.0f} KiB per rollout over the second half"
    )


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _serve(int(sys.argv[2]), sys.argv[3] == "sdk")
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--before-sessions", type=int, default=200)
    parser.add_argument("--rollouts", type=int, default=100)
    args = parser.parse_args()
    os.environ.pop("OPENCODE_ENV_TOKEN", None)
    for line in asyncio.run(_sessions(args.before_sessions, sdk_defaults=True)):
        print(line, flush=True)
    for line in asyncio.run(_sessions(args.sessions, sdk_defaults=False)):
        print(line, flush=True)
    print(asyncio.run(_rollouts(args.rollouts)), flush=True)


if __name__ == "__main__":
    main()
