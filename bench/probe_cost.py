"""The endpoint probe's cost per rollout, uncached (every rollout probes) and cached (one probe per server, model
and key per PROBE_TTL_S), side by side in one run, against the scripted model on loopback; and the per-call template
check (one /tokenize beside each model call).

Loopback with a model that answers at once: the figures are the probe's own overhead (HTTP, rewrite, fold); on a
real server each of its calls also waits for a few generated tokens (4, and up to 64 for the tool call).

    uv run --frozen python -m bench.probe_cost [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import httpx

from opencode_env.proxy.fingerprint import PROBE_HEADER, tokenize_body
from opencode_env.rollout.endpoints import Upstream
from opencode_env.rollout.preflight.probe import forget_probes, probe_endpoint
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script


async def timed(rounds: int, work: Callable[[], Awaitable[None]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await work()
        samples.append(time.perf_counter() - started)
    return samples


async def main(rounds: int) -> None:
    with ScriptedModelServer(demo_script()) as model:
        upstream = Upstream("", model.base_url, "sk-bench", "scripted-policy", disable_thinking=False)

        async def uncached() -> None:
            forget_probes()
            await probe_endpoint(upstream, top_logprobs=5)

        async def cached() -> None:
            await probe_endpoint(upstream, top_logprobs=5)

        async with httpx.AsyncClient() as client:
            root = model.base_url.removesuffix("/v1")

            async def template_check() -> None:
                await client.post(
                    f"{root}/tokenize", json=tokenize_body("scripted-policy"), headers={PROBE_HEADER: "1"}
                )

            await uncached()
            cold = await timed(rounds, uncached)
            warm = await timed(rounds * 10, cached)
            check = await timed(rounds * 10, template_check)
        calls = len(model.model.probe_exchanges) / (rounds + 1)
    cold_ms, warm_ms, check_ms = (statistics.median(s) * 1000 for s in (cold, warm, check))
    print(
        f"probe, uncached:        {cold_ms:8.2f} ms median per rollout ({calls:.0f} chat calls + /models + /tokenize)"
    )
    print(f"probe, cached:          {warm_ms:8.4f} ms median per rollout")
    print(f"uncached / cached:      {cold_ms / warm_ms:8.0f}x")
    print(f"template check per call:{check_ms:8.2f} ms median (concurrent with the model call, not added to it)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
