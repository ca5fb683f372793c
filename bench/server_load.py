"""64 concurrent tool calls through a real server whose sandboxes only sleep: does everything complete, does
/health stay responsive, and what does one in-flight rollout cost the server in memory?

    uv run python -m bench.server_load [--calls 64] [--rollout-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

SERVER = """
import sys, uvicorn
from opencode_env.testing.stub_backend import StubBackend
from server.environment import configure
configure(StubBackend(create_s=0.2, command_s=float(sys.argv[2])))
from server.app import build_app
uvicorn.run(build_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def call(client: httpx.AsyncClient, url: str) -> str:
    arguments = {
        "instruction": "x",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "m",
        "mode": "black_box",
        "verify": ["true"],
        "setup": ["true"],
    }
    payload = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "run_rollout", "arguments": arguments},
    }
    response = await client.post(
        f"{url}/mcp/stream", json=payload, headers={"accept": "application/json, text/event-stream"}
    )
    data = next(line[5:] for line in response.text.split("\n") if line.startswith("data:"))
    status: str = json.loads(data)["result"]["structuredContent"]["status"]
    return status


async def poll_health(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, latencies: list[float], peak: list[float], pid: int
) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        response = await client.get(f"{url}/health")
        latencies.append(time.perf_counter() - started)
        assert response.status_code == 200
        peak.append(rss_mb(pid))
        await asyncio.sleep(0.02)


async def measure(url: str, pid: int, calls: int) -> None:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=calls + 8)) as client:
        idle_latencies: list[float] = []
        for _ in range(50):
            started = time.perf_counter()
            await client.get(f"{url}/health")
            idle_latencies.append(time.perf_counter() - started)
        await call(client, url)
        idle = rss_mb(pid)
        stop, latencies, peak = asyncio.Event(), [], []  # type: ignore[var-annotated]
        poller = asyncio.ensure_future(poll_health(client, url, stop, latencies, peak, pid))
        started = time.perf_counter()
        statuses = await asyncio.gather(*(call(client, url) for _ in range(calls)))
        wall = time.perf_counter() - started
        stop.set()
        await poller
    answered = dict(Counter(statuses))
    ordered = sorted(latencies)
    p99 = ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)]
    # The stub's agent exits 0 without calling a model, which a rollout rightly reports as agent_error.
    print(f"{calls} concurrent tool calls answered in {wall:.2f}s wall: {answered}")
    print(
        f"/health latency: idle p50 {statistics.median(idle_latencies) * 1000:.2f} ms; under load p50 "
        f"{statistics.median(latencies) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, max {max(latencies) * 1000:.2f} ms "
        f"({len(latencies)} probes)"
    )
    print(
        f"server RSS: idle {idle:.1f} MB, peak {max(peak):.1f} MB, "
        f"{(max(peak) - idle) * 1024 / calls:.0f} KB per in-flight rollout"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--rollout-s", type=float, default=2.0, help="how long each stub command sleeps")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), str(args.rollout_s / 3)],
        env={**os.environ, "MAX_CONCURRENT_ENVS": str(args.calls + 8)},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        asyncio.run(measure(url, server.pid, args.calls))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
