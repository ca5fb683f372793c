"""Direct vs through the capture proxy, side by side in one run, against the scripted model on loopback.

    uv run python -m bench.proxy_overhead [--runs 30]

The request body is a real one: OpenCode's first request of the demo task (~31 KB, 10 tools), captured at start.
The direct path sends it with the same logprob / token-id parameters the proxy adds, so both streams are the same.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.opencode_body import capture_opencode_request
from opencode_env.proxy.capture import RewriteConfig, rewrite_request
from opencode_env.testing.script import Script, Step
from tests.proxy_process import ProxyProcess, running_proxy

REWRITE = RewriteConfig(endpoint_kind="vllm", model_override="scripted-policy", top_logprobs=5, max_tokens_cap=4096)


@dataclass(frozen=True)
class Sample:
    ttfb: float
    done: float
    end: float


@dataclass(frozen=True)
class Scenario:
    name: str
    tokens: int
    delay_s: float

    def step(self) -> Step:
        return Step(content="w " * ((self.tokens - 1) // 2), token_delay_s=self.delay_s)


@contextmanager
def model_process(script: Script, directory: Path) -> Iterator[str]:
    script_file, port_file = directory / "script.json", directory / "model.port"
    script_file.write_text(script.model_dump_json())
    process = subprocess.Popen(
        [sys.executable, "-m", "opencode_env.testing", "--script", str(script_file), "--port-file", str(port_file)]
    )
    try:
        while not port_file.exists():
            if process.poll() is not None:
                raise RuntimeError("the scripted model did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port_file.read_text()}/v1"
    finally:
        process.terminate()
        process.wait(timeout=10)


async def one_request(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Sample:
    started = time.perf_counter()
    ttfb = done = 0.0
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        async for piece in response.aiter_raw():
            now = time.perf_counter()
            if not ttfb:
                ttfb = now - started
            if b"[DONE]" in piece:
                done = now - started
    return Sample(ttfb, done, time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of pid, from the scheduler's exact runtime (schedstat, in nanoseconds).

    /proc/PID/stat's tick-sampled utime/stime mis-charges a process that wakes in step with timer ticks, which a
    proxy relaying tokens every 5 ms does."""
    tasks = Path(f"/proc/{pid}/task")
    return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks.iterdir()) / 1e9


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def run_scenario(scenario: Scenario, body: dict[str, Any], runs: int, concurrencies: list[int]) -> None:
    direct_body = rewrite_request(body, REWRITE)
    rounds = 5
    total = 3 * 2 + runs * 4 + rounds * sum(concurrencies) * 2 + 10
    script = Script(steps=[scenario.step()] * total)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        with (
            model_process(script, directory) as model_url,
            running_proxy(
                model_url, directory, "--endpoint-kind", "vllm", "--model-override", "scripted-policy"
            ) as proxy,
        ):
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
                for _ in range(3):
                    await one_request(client, model_url, direct_body)
                    await one_request(client, proxy.url, body)
                paths = await interleaved(client, model_url, proxy, body, direct_body, runs)
                report(scenario, paths, runs)
                for concurrency in concurrencies:
                    concurrent = await concurrent_rounds(
                        client, model_url, proxy, body, direct_body, concurrency, rounds
                    )
                    report_concurrent(scenario, concurrent, concurrency, rounds)
                print(f"proxy peak RSS: {peak_rss_mb(proxy.process.pid):.1f} MB")


async def fresh_request(url: str, body: dict[str, Any]) -> Sample:
    """One request on a connection of its own (as a client without keep-alive, or OpenCode's fetch after idling)."""
    async with httpx.AsyncClient(timeout=120) as client:
        return await one_request(client, url, body)


@dataclass
class Paths:
    """Per path, the samples of the interleaved runs; proxy CPU and trace bytes of the proxied ones."""

    direct: list[Sample]
    proxied: list[Sample]
    direct_fresh: list[Sample]
    proxied_fresh: list[Sample]
    cpu: float = 0.0
    trace_bytes: int = 0


async def interleaved(
    client: httpx.AsyncClient,
    model_url: str,
    proxy: ProxyProcess,
    body: dict[str, Any],
    direct_body: dict[str, Any],
    runs: int,
) -> Paths:
    paths = Paths([], [], [], [])
    trace_before = proxy.trace_path.stat().st_size
    for _ in range(runs):
        paths.direct.append(await one_request(client, model_url, direct_body))
        before = cpu_seconds(proxy.process.pid)
        paths.proxied.append(await one_request(client, proxy.url, body))
        await asyncio.sleep(0.05)
        paths.cpu += cpu_seconds(proxy.process.pid) - before
        paths.direct_fresh.append(await fresh_request(model_url, direct_body))
        before = cpu_seconds(proxy.process.pid)
        paths.proxied_fresh.append(await fresh_request(proxy.url, body))
        await asyncio.sleep(0.05)
        paths.cpu += cpu_seconds(proxy.process.pid) - before
    paths.trace_bytes = proxy.trace_path.stat().st_size - trace_before
    return paths


async def concurrent_rounds(
    client: httpx.AsyncClient,
    model_url: str,
    proxy: ProxyProcess,
    body: dict[str, Any],
    direct_body: dict[str, Any],
    concurrency: int,
    rounds: int,
) -> tuple[list[float], list[float], float]:
    direct: list[float] = []
    proxied: list[float] = []
    cpu = 0.0
    for _ in range(rounds):
        samples = await asyncio.gather(*(one_request(client, model_url, direct_body) for _ in range(concurrency)))
        direct.extend(s.end for s in samples)
        before = cpu_seconds(proxy.process.pid)
        samples = await asyncio.gather(*(one_request(client, proxy.url, body) for _ in range(concurrency)))
        await asyncio.sleep(0.1)
        cpu += cpu_seconds(proxy.process.pid) - before
        proxied.extend(s.end for s in samples)
    return direct, proxied, cpu


def ms(value: float) -> str:
    return f"{value * 1000:8.2f}"


def report(scenario: Scenario, paths: Paths, runs: int) -> None:
    print(
        f"\n== {scenario.name}: {scenario.tokens} tokens, {scenario.delay_s * 1000:.0f} ms between tokens, "
        f"{runs} interleaved runs per path (ms; p10 / p50 / p90)"
    )
    print(f"{'metric':<30}{'direct':>26}{'proxied':>26}{'ratio p50':>11}{'added p50':>11}")
    for connection, direct, proxied in (
        ("reused connection", paths.direct, paths.proxied),
        ("new connection", paths.direct_fresh, paths.proxied_fresh),
    ):
        for label, attribute in (("first byte", "ttfb"), ("[DONE]", "done"), ("end of body", "end")):
            d = [getattr(sample, attribute) for sample in direct]
            p = [getattr(sample, attribute) for sample in proxied]
            d50, p50 = statistics.median(d), statistics.median(p)
            print(
                f"{label + ', ' + connection:<30}{spread(d):>26}{spread(p):>26}{p50 / d50:>10.3f}x{ms(p50 - d50):>11}"
            )
    tokens = 2 * runs * scenario.tokens
    print(
        f"proxy CPU per streamed token: {paths.cpu / tokens * 1e6:.1f} us;  "
        f"trace bytes per token: {paths.trace_bytes / tokens:.0f}"
    )


def report_concurrent(
    scenario: Scenario, concurrent: tuple[list[float], list[float], float], concurrency: int, rounds: int
) -> None:
    direct_c, proxied_c, cpu_c = concurrent
    d50, p50 = statistics.median(direct_c), statistics.median(proxied_c)
    print(
        f"{concurrency} concurrent streams x {rounds} rounds: end of body p50 direct {ms(d50)} ms, "
        f"proxied {ms(p50)} ms, ratio {p50 / d50:.3f}x; proxy CPU per token "
        f"{cpu_c / (rounds * concurrency * scenario.tokens) * 1e6:.1f} us"
    )


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def spread(values: list[float]) -> str:
    return "/".join(f"{percentile(values, q) * 1000:.2f}" for q in (0.1, 0.5, 0.9))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--concurrency", default="8,32", help="comma-separated numbers of concurrent streams")
    args = parser.parse_args()
    body = capture_opencode_request()
    size = len(__import__("json").dumps(body))
    print(f"OpenCode request body: {size} bytes, {len(body.get('tools', []))} tools")
    for scenario in (Scenario("burst", 1000, 0.0), Scenario("decode-rate", 200, 0.005)):
        asyncio.run(run_scenario(scenario, body, args.runs, [int(n) for n in args.concurrency.split(",")]))


if __name__ == "__main__":
    main()
