"""How fast a wrong address is said: a rollout whose model server is not there, and a client whose server is not
there, each beside the healthy case measured in the same run.

- rollout, model URL on a closed port: `run_rollout` to its result (refused at the endpoint probe, before any
  sandbox), against the uncached probe of the scripted model (what every healthy rollout pays first). Before the
  probe classified refusals, the sandbox and OpenCode started and three model calls failed: 18-34 s on this machine.
- client, server URL on a closed port, another host (127.0.0.2: refused is an answer) and this machine (retried as
  a server still binding its port, within the connect timeout, 1 s here); before, 15 s for both.

    uv run --frozen python -m bench.endpoint_errors [rounds]
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from opencode_env import OpenCodeEnv
from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import forget_probes, probe_endpoint
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.testing.stub_backend import StubBackend


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def timed(rounds: int, work: Callable[[], Awaitable[object]]) -> float:
    samples = []
    for _ in range(rounds):
        forget_probes()
        started = time.perf_counter()
        await work()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def refused_client(url: str, connect_timeout_s: float) -> None:
    try:
        await OpenCodeEnv(base_url=url, connect_timeout_s=connect_timeout_s).connect()
    except ConnectionError:
        return
    raise AssertionError(f"{url} answered")


async def refused_rollout(dead_model: str) -> None:
    result = await run_rollout(demo_request(dead_model, endpoint=""), StubBackend())
    if result.status != "upstream_error":
        raise SystemExit(f"a rollout whose model URL is refused ended {result.status}, not upstream_error")


async def main(rounds: int) -> None:
    dead_model = f"http://127.0.0.1:{closed_port()}/v1"
    with ScriptedModelServer(demo_script()) as model:
        healthy = Upstream("", model.base_url, "sk-bench", "scripted-policy", disable_thinking=False)
        probe_s = await timed(rounds, lambda: probe_endpoint(healthy, top_logprobs=5))
        refused_s = await timed(rounds, lambda: refused_rollout(dead_model))
    other_host_s = await timed(rounds, lambda: refused_client(f"http://127.0.0.2:{closed_port()}", 10.0))
    this_host_s = await timed(max(rounds // 5, 1), lambda: refused_client(f"http://127.0.0.1:{closed_port()}", 1.0))
    print(f"healthy probe (uncached), scripted model:      {probe_s * 1000:9.1f} ms")
    ratio = refused_s / probe_s
    print(f"rollout, model URL refused, to its result:     {refused_s * 1000:9.1f} ms  ({ratio:.2f}x the probe)")
    print(f"client, no server on another host:             {other_host_s * 1000:9.1f} ms  (was 15 000 ms)")
    print(f"client, no server here, connect timeout 1 s: {this_host_s * 1000:9.1f} ms  (was 15 000 ms at any timeout)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
