"""Direct, through a bare byte relay, and through the capture proxy, side by side in one run, against the scripted
model on loopback.

    uv run python -m bench.proxy_overhead [--runs 30] [--concurrency 8,32]

The request body is a real one: OpenCode's first request of the demo task (26 KB and 8 tools with OpenCode 1.18.33),
captured at start. The direct and relay paths send it with the same logprob / token-id parameters the proxy adds, so
all three streams are the same. The byte relay (bench/byte_relay.py) copies bytes and does nothing else: its CPU per
token is what any relay pays on this machine (a wakeup, a read and a write per token that arrives alone), so the
proxy's own cost is the difference. CPU is the relay's or the proxy's process only, from the scheduler's exact
runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.opencode_body import capture_opencode_request
from opencode_env.proxy.request import RewriteConfig, rewrite_request
from opencode_env.scripted.script import Script, Step
from opencode_env.testing.proxy_process import running_proxy

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
        [sys.executable, "-m", "opencode_env.scripted", "--script", str(script_file), "--port-file", str(port_file)]
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


@contextmanager
def relay_process(model_url: str, directory: Path) -> Iterator[Relay]:
    """bench/byte_relay in front of the model: the floor of any relay on this machine."""
    port_file = directory / "relay.port"
    upstream = model_url.removeprefix("http://").split("/", 1)[0]
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.byte_relay", "--upstream", upstream, "--port-file", str(port_file)]
    )
    try:
        while not port_file.exists():
            if process.poll() is not None:
                raise RuntimeError("the byte relay did not start")
            time.sleep(0.01)
        yield Relay(f"http://127.0.0.1:{port_file.read_text()}/v1", process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass(frozen=True)
class Relay:
    url: str
    pid: int


@dataclass(frozen=True)
class Route:
    """One way to the model: what the client sends, and the process whose CPU is counted (none when direct)."""

    name: str
    url: str
    body: dict[str, Any]
    pid: int | None


async def run_scenario(scenario: Scenario, body: dict[str, Any], runs: int, concurrencies: list[int]) -> None:
    rounds = 5
    total = 3 * (3 + runs * 2 + rounds * sum(concurrencies)) + 10
    script = Script(steps=[scenario.step()] * total)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        with (
            model_process(script, directory) as model_url,
            relay_process(model_url, directory) as relay,
            running_proxy(
                model_url, directory, "--endpoint-kind", "vllm", "--model-override", "scripted-policy"
            ) as proxy,
        ):
            direct_body = rewrite_request(body, REWRITE)
            routes = [
                Route("direct", model_url, direct_body, None),
                Route("byte relay", relay.url, direct_body, relay.pid),
                Route("proxy", proxy.url, body, proxy.process.pid),
            ]
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=128)) as client:
                for _ in range(3):
                    for route in routes:
                        await one_request(client, route.url, route.body)
                trace_before = proxy.trace_path.stat().st_size
                paths = await interleaved(client, routes, runs)
                trace_bytes = proxy.trace_path.stat().st_size - trace_before
                report(scenario, paths, runs, trace_bytes)
                for concurrency in concurrencies:
                    concurrent = [await concurrent_rounds(client, route, concurrency, rounds) for route in routes]
                    report_concurrent(scenario, routes, concurrent, concurrency, rounds)
                print(f"proxy peak RSS: {peak_rss_mb(proxy.process.pid):.1f} MB")


async def fresh_request(url: str, body: dict[str, Any]) -> Sample:
    """One request on a connection of its own (as a client without keep-alive, or OpenCode's fetch after idling)."""
    async with httpx.AsyncClient(timeout=120) as client:
        return await one_request(client, url, body)


@dataclass
class RouteSamples:
    """One route's samples over the interleaved runs, on a reused and on a new connection, and its CPU seconds."""

    route: Route
    reused: list[Sample] = field(default_factory=list)
    fresh: list[Sample] = field(default_factory=list)
    cpu: float = 0.0


async def timed(route: Route, path: RouteSamples, request: Awaitable[Sample]) -> Sample:
    before = cpu_seconds(route.pid) if route.pid else 0.0
    sample = await request
    if route.pid:
        await asyncio.sleep(0.05)
        path.cpu += cpu_seconds(route.pid) - before
    return sample


async def interleaved(client: httpx.AsyncClient, routes: list[Route], runs: int) -> list[RouteSamples]:
    paths = [RouteSamples(route) for route in routes]
    for _ in range(runs):
        for path in paths:
            route = path.route
            path.reused.append(await timed(route, path, one_request(client, route.url, route.body)))
        for path in paths:
            route = path.route
            path.fresh.append(await timed(route, path, fresh_request(route.url, route.body)))
    return paths


async def concurrent_rounds(
    client: httpx.AsyncClient, route: Route, concurrency: int, rounds: int
) -> tuple[list[float], float]:
    ends: list[float] = []
    cpu = 0.0
    for _ in range(rounds):
        before = cpu_seconds(route.pid) if route.pid else 0.0
        samples = await asyncio.gather(*(one_request(client, route.url, route.body) for _ in range(concurrency)))
        if route.pid:
            await asyncio.sleep(0.1)
            cpu += cpu_seconds(route.pid) - before
        ends.extend(s.end for s in samples)
    return ends, cpu


def ms(value: float) -> str:
    return f"{value * 1000:8.2f}"


def report(scenario: Scenario, paths: list[RouteSamples], runs: int, trace_bytes: int) -> None:
    direct, relayed = paths[0], paths[1:]
    names = [path.route.name for path in relayed]
    print(
        f"\n== {scenario.name}: {scenario.tokens} tokens, {scenario.delay_s * 1000:.0f} ms between tokens, "
        f"{runs} interleaved runs per path (ms; p10 / p50 / p90; ratio and added time at p50, against direct)"
    )
    header = f"{'metric':<30}{'direct':>24}" + "".join(f"{name:>24}{'ratio':>8}{'added':>9}" for name in names)
    print(header)
    for connection in ("reused", "fresh"):
        for label, attribute in (("first byte", "ttfb"), ("[DONE]", "done"), ("end of body", "end")):
            base = [getattr(sample, attribute) for sample in getattr(direct, connection)]
            row = f"{label + ', ' + connection + ' connection':<30}{spread(base):>24}"
            for path in relayed:
                values = [getattr(sample, attribute) for sample in getattr(path, connection)]
                d50, p50 = statistics.median(base), statistics.median(values)
                row += f"{spread(values):>24}{p50 / d50:>7.3f}x{ms(p50 - d50):>9}"
            print(row)
    tokens = 2 * runs * scenario.tokens
    cpu = "; ".join(f"{path.route.name} {path.cpu / tokens * 1e6:.1f} us" for path in relayed)
    print(f"CPU per streamed token: {cpu};  proxy trace bytes per token: {trace_bytes / tokens:.0f}")


def report_concurrent(
    scenario: Scenario,
    routes: list[Route],
    concurrent: list[tuple[list[float], float]],
    concurrency: int,
    rounds: int,
) -> None:
    d50 = statistics.median(concurrent[0][0])
    parts = [f"direct {ms(d50).strip()} ms"]
    tokens = rounds * concurrency * scenario.tokens
    for route, (ends, cpu) in zip(routes[1:], concurrent[1:], strict=True):
        p50 = statistics.median(ends)
        parts.append(f"{route.name} {ms(p50).strip()} ms ({p50 / d50:.3f}x, CPU {cpu / tokens * 1e6:.1f} us/token)")
    print(f"{concurrency} concurrent streams x {rounds} rounds, end of body p50: " + ", ".join(parts))


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
