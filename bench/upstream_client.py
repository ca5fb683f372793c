"""The proxy's own upstream client (UpstreamPool) against httpx.AsyncClient, side by side in one run: CPU per
streamed token of the client's process, streaming from the scripted model in a process of its own on loopback.

    uv run python -m bench.upstream_client [--runs 30] [--concurrency 8] [--loop uvloop|asyncio]

Each client keeps its connections alive and reads the body as it comes without parsing it (UpstreamPool.iter_body,
httpx's aiter_raw), which is what the proxy's relay does before its own work. The runs interleave the two clients,
so a drift of the machine touches both alike. CPU is time.process_time() of this process, which runs nothing else
(the model is another process); the ratio is httpx's over the pool's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvloop

from bench.proxy_overhead import Scenario, model_process
from opencode_env.proxy.request import RewriteConfig, rewrite_request
from opencode_env.proxy.upstream import Origin, UpstreamPool
from opencode_env.scripted.script import Script

REWRITE = RewriteConfig(endpoint_kind="vllm", model_override="scripted-policy", top_logprobs=5, max_tokens_cap=4096)
BODY = {
    "model": "policy",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "system", "content": "You are a coder."}, {"role": "user", "content": "Write add(a, b)."}],
    "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
}
"""With tools: the scripted model answers a request without them as a title request, in a few tokens."""
HEADERS = {"content-type": "application/json", "accept": "text/event-stream", "authorization": "Bearer sk-bench"}
Stream = Callable[[], Awaitable[int]]


@dataclass
class Samples:
    name: str
    cpu: list[float] = field(default_factory=list)
    """CPU seconds per token, one value per run."""
    wall: list[float] = field(default_factory=list)


def pool_stream(pool: UpstreamPool, payload: bytes) -> Stream:
    async def stream() -> int:
        response = await pool.post("/chat/completions", payload, HEADERS)
        return sum([len(piece) async for piece in response.iter_body()])

    return stream


def httpx_stream(client: httpx.AsyncClient, url: str, payload: bytes) -> Stream:
    async def stream() -> int:
        async with client.stream("POST", f"{url}/chat/completions", content=payload, headers=HEADERS) as response:
            return sum([len(piece) async for piece in response.aiter_raw()])

    return stream


async def measure(stream: Stream, samples: Samples, tokens: int, concurrency: int) -> None:
    cpu, wall = time.process_time(), time.perf_counter()
    sizes = await asyncio.gather(*(stream() for _ in range(concurrency)))
    if min(sizes) < tokens * 100:
        raise RuntimeError(f"{samples.name}: a body of {min(sizes)} bytes is not {tokens} streamed tokens")
    samples.cpu.append((time.process_time() - cpu) / (tokens * concurrency))
    samples.wall.append(time.perf_counter() - wall)


async def compare(url: str, scenario: Scenario, runs: int, concurrency: int) -> list[Samples]:
    payload = json.dumps(rewrite_request(BODY, REWRITE)).encode()
    pool = UpstreamPool(Origin.parse(url), connect_timeout_s=10, idle_timeout_s=120, size=64, route=None)
    timeout = httpx.Timeout(120, connect=10)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        streams = [
            (Samples("UpstreamPool"), pool_stream(pool, payload)),
            (Samples("httpx"), httpx_stream(client, url, payload)),
        ]
        for _ in range(2):
            for _samples, stream in streams:
                await measure(stream, Samples("warm-up"), scenario.tokens, concurrency)
        for _ in range(runs):
            for samples, stream in streams:
                await measure(stream, samples, scenario.tokens, concurrency)
    await pool.aclose()
    return [samples for samples, _ in streams]


def report(scenario: Scenario, concurrency: int, results: list[Samples]) -> None:
    base = results[0]
    print(
        f"\n== {scenario.name}: {scenario.tokens} tokens, {scenario.delay_s * 1000:.0f} ms apart, "
        f"{concurrency} stream(s) at once, {len(base.cpu)} interleaved runs per client"
    )
    print(f"{'client':<14}{'CPU us/token p50':>18}{'p10':>8}{'p90':>8}{'ratio':>8}{'wall ms p50':>13}")
    for samples in results:
        p50 = statistics.median(samples.cpu)
        p10, p90 = (statistics.quantiles(samples.cpu, n=10)[i] for i in (0, 8))
        ratio = p50 / statistics.median(base.cpu)
        wall = statistics.median(samples.wall) * 1000
        print(f"{samples.name:<14}{p50 * 1e6:>18.2f}{p10 * 1e6:>8.2f}{p90 * 1e6:>8.2f}{ratio:>7.3f}x{wall:>13.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=8, help="streams at once in the concurrent round")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the proxy runs on uvloop")
    args = parser.parse_args()
    scenarios = [Scenario("burst", 1000, 0.0), Scenario("decode-rate", 200, 0.005)]
    rounds = [(scenario, concurrency) for scenario in scenarios for concurrency in (1, args.concurrency)]
    factory: Any = uvloop.new_event_loop if args.loop == "uvloop" else asyncio.new_event_loop
    print(f"loop: {args.loop}; CPU is this process's (time.process_time), the model runs in another")
    for scenario, concurrency in rounds:
        steps = (2 + args.runs) * 2 * concurrency + 10
        with (
            tempfile.TemporaryDirectory() as scratch,
            model_process(Script(steps=[scenario.step()] * steps), Path(scratch)) as url,
            asyncio.Runner(loop_factory=factory) as runner,
        ):
            results = runner.run(compare(url, scenario, args.runs, concurrency))
        report(scenario, concurrency, results)


if __name__ == "__main__":
    main()
