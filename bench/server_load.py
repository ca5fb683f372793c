"""Up to 1,000 concurrent tool calls through a real server whose sandboxes only wait (bench.latency_backend): does
every call complete, does /health stay responsive, does the server's event loop stall, what does one in-flight
rollout cost the server in memory? Over the standard MCP transport (MCP sessions over streamable HTTP at /mcp) and
OpenEnv's WebSocket (/ws, the protocol opencode_env's client speaks).

    uv run python -m bench.server_load [--levels 64,256,1000] [--transports mcp,ws] [--calls-per-session 8]

Each (transport, level) gets a fresh server process (bench.load_server) with the rollout cap raised to the level, so
that memory one level leaves behind does not hide the next level's growth. The rollouts are transparent_proxy ones:
sandbox ~1 s, commands 0.05-0.5 s, agent 3-5 s, file calls ~10 ms, and a 4-turn proxy trace with logprobs read back
(results ~180 KB of JSON each). /health is probed from a separate process; the event loop's lag is measured inside
the server (a task sleeping 10 ms, how late it wakes).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.serving import free_port, running_server
from opencode_env.client.ws_session import OpenEnvSession
from opencode_env.testing.demo import demo_request
from opencode_env.wire.models import TOOL_NAME

TARGET_HEALTH_P99_S = 0.100
TARGET_MAX_LAG_S = 0.050
CALL_TIMEOUT_S = 600.0
PROTOCOL_VERSION = "2025-11-25"
ARGUMENTS = demo_request("http://127.0.0.1:9/v1").model_dump(mode="json")


@dataclass
class Measured:
    transport: str
    calls: int
    outcomes: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    health_s: list[float] = field(default_factory=list)
    health_timeouts: int = 0
    ticks: list[tuple[float, float, float]] = field(default_factory=list)
    gc_pauses: list[tuple[int, float]] = field(default_factory=list)
    idle_rss_kb: int = 0
    peak_rss_kb: int = 0
    in_flight_at_peak: int = 0
    max_in_flight: int = 0
    server_cpu_s: float = 0.0
    load: float = 0.0

    @property
    def lag_s(self) -> list[float]:
        return [late for late, _, _ in self.ticks]

    @property
    def loop_cpu_s(self) -> list[float]:
        """CPU seconds the loop's own thread spent within each tick: the work that ran on the loop between a 10 ms
        sleep and its wake-up, which is what the tick would be late by on an idle machine (the wall lag adds the
        time spent waiting for a CPU, which on a shared 2-core machine is most of it)."""
        return [own_cpu for _, own_cpu, _ in self.ticks]

    @property
    def completed(self) -> int:
        return self.outcomes.get("completed", 0)

    def targets(self) -> dict[str, bool]:
        return {
            "every call completes": self.completed == self.calls,
            "/health p99 < 100 ms": percentile(self.health_s, 0.99) < TARGET_HEALTH_P99_S,
            "no loop stall > 50 ms": max(self.lag_s, default=0.0) <= TARGET_MAX_LAG_S,
            "(no loop work > 50 ms in one tick)": max(self.loop_cpu_s, default=0.0) <= TARGET_MAX_LAG_S,
        }


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def proc_status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_1m() -> float:
    return os.getloadavg()[0]


@contextmanager
def server_process(max_rollouts: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.load_server", str(port), str(max_rollouts)]
    with running_server(argv, f"{url}/bench/lag") as pid:
        yield url, pid


def outcome_of(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:100]}"


class McpSession:
    """One session of the standard streamable-HTTP MCP transport, spoken with httpx: initialize, then tool calls as
    concurrent POSTs whose answers arrive as server-sent events. The SDK's own clients (fastmcp's too) also check
    every result against the tool's output schema with jsonschema, ~0.2-0.5 s of CPU per 180 KB result here, which
    on a shared 2-core machine would slow the server more than the calls themselves."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self._http = http
        self._url = f"{url}/mcp"
        self._headers = {"accept": "application/json, text/event-stream"}
        self._ids = itertools.count(1)

    async def initialize(self) -> None:
        client_info = {"name": "bench.server_load", "version": "0"}
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": client_info}
        response = await self._http.post(self._url, json=self._message("initialize", params), headers=self._headers)
        response.raise_for_status()
        answer = sse_answer(response.text)
        self._headers["mcp-session-id"] = response.headers["mcp-session-id"]
        self._headers["mcp-protocol-version"] = answer["result"]["protocolVersion"]
        notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        (await self._http.post(self._url, json=notice, headers=self._headers)).raise_for_status()

    def _message(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        message = self._message("tools/call", {"name": name, "arguments": arguments})
        response = await self._http.post(self._url, json=message, headers=self._headers, timeout=CALL_TIMEOUT_S)
        response.raise_for_status()
        answer = sse_answer(response.text)
        if "error" in answer:
            raise RuntimeError(f"JSON-RPC error: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result


def sse_answer(body: str) -> dict[str, Any]:
    """The JSON-RPC response among the events of one POST's stream (progress notifications may precede it)."""
    for line in body.split("\n"):
        if line.startswith("data:"):
            message: dict[str, Any] = json.loads(line[5:])
            if "id" in message and ("result" in message or "error" in message):
                return message
    raise RuntimeError(f"no JSON-RPC response in the stream: {body[:200]!r}")


async def mcp_calls(url: str, calls: int, calls_per_session: int) -> list[str]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def session(count: int) -> list[str]:
            client = McpSession(http, url)
            await client.initialize()

            async def one() -> str:
                result = await client.call_tool(TOOL_NAME, ARGUMENTS)
                return str((result.get("structuredContent") or {}).get("status", "no structured content"))

            return list(await asyncio.gather(*(guarded(one) for _ in range(count))))

        sizes = [min(calls_per_session, calls - start) for start in range(0, calls, calls_per_session)]
        outcomes = await asyncio.gather(*(guarded_many(session(size), size) for size in sizes))
    return [outcome for group in outcomes for outcome in group]


async def ws_calls(url: str, calls: int) -> list[str]:
    async def one() -> str:
        async with OpenEnvSession(url, message_timeout_s=CALL_TIMEOUT_S) as session:
            data = await session.call_tool(TOOL_NAME, **ARGUMENTS)
        return str(data.get("status", "no status")) if isinstance(data, dict) else "not an object"

    return list(await asyncio.gather(*(guarded(one) for _ in range(calls))))


async def guarded(call: Callable[[], Awaitable[str]]) -> str:
    try:
        return await call()
    except Exception as error:  # every failure is counted by its type and message, and printed
        return outcome_of(error)


async def guarded_many(calls: Awaitable[list[str]], count: int) -> list[str]:
    """A session that fails as a whole (its connection, its handshake) fails each of its calls."""
    try:
        return await calls
    except Exception as error:  # every failure is counted by its type and message, and printed
        return [f"session {outcome_of(error)}"] * count


async def measure(url: str, pid: int, transport: str, calls: int, calls_per_session: int) -> Measured:
    run: Callable[[int], Awaitable[list[str]]]
    if transport == "mcp":
        run = lambda count: mcp_calls(url, count, calls_per_session)  # noqa: E731
    else:
        run = lambda count: ws_calls(url, count)  # noqa: E731
    measured = Measured(transport, calls)
    async with httpx.AsyncClient(timeout=300) as http:
        warm_up = await run(1)  # imports, first-call paths and schema caches are paid before measuring
        if warm_up != ["completed"]:
            raise RuntimeError(f"the warm-up call did not complete: {warm_up}")
        await asyncio.sleep(1.0)
        await http.get(f"{url}/bench/lag")
        measured.idle_rss_kb = proc_status_kb(pid, "VmRSS")
        cpu_before = cpu_seconds(pid)
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.health_probe", url, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        started = time.perf_counter()
        measured.outcomes = Counter(await run(calls))
        measured.wall_s = time.perf_counter() - started
        measured.load = load_1m()
        out, _ = await probe.communicate(b"")
        probed = json.loads(out)
        measured.health_s, measured.health_timeouts = probed["latencies"], probed["timeouts"]
        watch = (await http.get(f"{url}/bench/lag")).json()
        measured.ticks = [(late, own_cpu, process_cpu) for late, own_cpu, process_cpu in watch["ticks"]]
        measured.gc_pauses = [(generation, pause) for generation, pause in watch["gc_pauses"]]
        measured.peak_rss_kb = max(watch["peak_rss_kb"], measured.idle_rss_kb)
        measured.in_flight_at_peak, measured.max_in_flight = watch["in_flight_at_peak"], watch["max_in_flight"]
        measured.server_cpu_s = cpu_seconds(pid) - cpu_before
    return measured


def report(m: Measured) -> None:
    failed = m.calls - m.completed
    others = {key: value for key, value in m.outcomes.items() if key != "completed"}
    growth_kb = (m.peak_rss_kb - m.idle_rss_kb) / max(m.max_in_flight, 1)
    full_pauses = [pause for generation, pause in m.gc_pauses if generation == 2]
    print(
        f"[{m.transport} x{m.calls}] completed {m.completed}/{m.calls}, failed {failed} {others or ''}; "
        f"wall {m.wall_s:.2f}s; load1 {m.load:.2f}"
    )
    print(
        f"  /health p50 {percentile(m.health_s, 0.5) * 1000:.1f} ms, p99 {percentile(m.health_s, 0.99) * 1000:.1f} "
        f"ms, max {max(m.health_s, default=0) * 1000:.1f} ms ({len(m.health_s)} probes, {m.health_timeouts} unanswered "
        "in 30 s)"
    )
    over = sum(1 for lag in m.lag_s if lag > TARGET_MAX_LAG_S)
    print(
        f"  loop lag p99 {percentile(m.lag_s, 0.99) * 1000:.1f} ms, max {max(m.lag_s, default=0) * 1000:.1f} ms "
        f"({over} of {len(m.lag_s)} ticks over 50 ms); loop-thread CPU per tick p99 "
        f"{percentile(m.loop_cpu_s, 0.99) * 1000:.1f} ms, max {max(m.loop_cpu_s, default=0) * 1000:.1f} ms"
    )
    print(
        f"  server RSS idle {m.idle_rss_kb / 1024:.0f} MB, peak {m.peak_rss_kb / 1024:.0f} MB with "
        f"{m.in_flight_at_peak} rollouts in flight (most at once {m.max_in_flight}): {growth_kb:.0f} KB per rollout "
        f"in flight at most; server CPU {m.server_cpu_s:.1f}s ({m.server_cpu_s / m.wall_s:.0%} of a core, "
        f"{m.server_cpu_s / m.calls * 1000:.0f} ms per call); GC: {len(m.gc_pauses)} collections, "
        f"{len(full_pauses)} full, longest {max(full_pauses, default=0) * 1000:.0f} ms, "
        f"{sum(pause for _, pause in m.gc_pauses):.1f}s in all"
    )
    print("  targets: " + ", ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in m.targets().items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="64,256,1000")
    parser.add_argument("--transports", default="mcp,ws")
    parser.add_argument(
        "--calls-per-session", type=int, default=8, help="concurrent calls each MCP client session carries"
    )
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    print(f"load1 at start {load_1m():.2f} on {os.cpu_count()} cores")
    for transport in args.transports.split(","):
        for calls in levels:
            with server_process(max_rollouts=calls) as (url, pid):
                report(asyncio.run(measure(url, pid, transport, calls, args.calls_per_session)))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
