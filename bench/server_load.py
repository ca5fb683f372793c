"""Up to 1,000 concurrent tool calls through a real server whose sandboxes only wait (bench.latency_backend): does
every call complete, does /health stay responsive, does the server's event loop stall, what does one in-flight
rollout cost the server in memory? Over the standard MCP transport (MCP sessions over streamable HTTP at /mcp) and
OpenEnv's WebSocket (/ws, the protocol opencode_env's client speaks).

    uv run python -m bench.server_load [--levels 64,256,1000] [--transports mcp,ws] [--calls-per-session 8]
        [--rounds 1] [--compare served,gc-defaults,older@/path/to/a/checkout --repeats 3]

Each (transport, level) gets a fresh server process (bench.load_server) with the rollout cap raised to the level, so
that memory one level leaves behind does not hide the next level's growth. A level is how many calls are in flight
at once; with --rounds N each of them is followed by the next as soon as it returns, N times. With --compare, each
named variant of the server (see VARIANTS; `NAME@DIR` is the server of another checkout of this repository, run
from DIR with this virtualenv) runs at each level, interleaved, --repeats times, and a table prints
them side by side: the server's CPU per call, the latency the server added to a call (the caller's wall time less
the rollout's own `wall_s`), p50 and p99, and the server's peak RSS, each also as a ratio to the first variant.

The rollouts are transparent_proxy ones: sandbox ~1 s, commands 0.05-0.5 s, agent 3-5 s, file calls ~10 ms, and a
4-turn proxy trace with logprobs read back (results ~180 KB of JSON each): shorter than real ones (5-600 s), so more
calls end per second at a level than in real use. /health is probed from a separate process; the event loop's lag
is measured inside the server (a task sleeping 10 ms, how late it wakes).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.serving import free_port, running_server
from opencode_env.client.ws_session import OpenEnvSession
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import TOOL_NAME

TARGET_HEALTH_P99_S = 0.100
TARGET_MAX_LAG_S = 0.050
IDLE_WINDOW_S = 4.0
CALL_TIMEOUT_S = 600.0
PROTOCOL_VERSION = "2025-11-25"
# The server as served, with CPython's collector settings, and with its heap frozen too (bench.load_server).
VARIANTS: dict[str, dict[str, str]] = {
    "served": {},
    "gc-defaults": {"BENCH_GC": "defaults"},
    "gc-frozen": {"BENCH_GC": "frozen"},
    "uvloop": {"BENCH_LOOP": "uvloop"},
}


@dataclass(frozen=True)
class Call:
    """How one call ended, and the seconds the server added to the rollout's own (None when it did not complete)."""

    outcome: str
    added_s: float | None = None


@dataclass
class Measured:
    transport: str
    calls: int
    outcomes: Counter[str] = field(default_factory=Counter)
    added_s: list[float] = field(default_factory=list)
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
    idle_cpu_per_s: float = 0.0
    load: float = 0.0

    @property
    def cpu_per_call_s(self) -> float:
        """The server's CPU per call, less what it spends idle (answering the /health probe, ticking the monitor)."""
        return max(self.server_cpu_s - self.idle_cpu_per_s * self.wall_s, 0.0) / max(self.calls, 1)

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
def server_process(
    max_rollouts: int, switches: dict[str, str] | None = None, checkout: str | None = None
) -> Iterator[tuple[str, int]]:
    """A bench.load_server process; from `checkout` (a directory: `python -m` puts it first on the path) when given."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.load_server", str(port), str(max_rollouts)]
    env = {**os.environ, **(switches or {})}
    with running_server(argv, f"{url}/bench/lag", env=env, cwd=checkout) as pid:
        yield url, pid


def variant_server(variant: str, level: int) -> AbstractContextManager[tuple[str, int]]:
    name, _, checkout = variant.partition("@")
    if checkout:
        return server_process(level, checkout=checkout)
    return server_process(level, VARIANTS[name])


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


def call_of(result: Any, started: float) -> Call:
    if not isinstance(result, dict):
        return Call("not an object")
    return Call(str(result.get("status")), time.perf_counter() - started - float(result.get("wall_s", 0.0)))


async def mcp_calls(
    url: str, arguments: dict[str, Any], calls: int, calls_per_session: int, rounds: int = 1
) -> list[Call]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def session(count: int) -> list[Call]:
            client = McpSession(http, url)
            await client.initialize()

            async def one() -> Call:
                started = time.perf_counter()
                result = await client.call_tool(TOOL_NAME, arguments)
                return call_of(result.get("structuredContent"), started)

            return flat(await asyncio.gather(*(in_rounds(one, rounds) for _ in range(count))))

        sizes = [min(calls_per_session, calls - start) for start in range(0, calls, calls_per_session)]
        return flat(await asyncio.gather(*(guarded_many(session(size), size * rounds) for size in sizes)))


async def ws_calls(url: str, arguments: dict[str, Any], calls: int, rounds: int = 1) -> list[Call]:
    async def one() -> Call:
        started = time.perf_counter()
        async with OpenEnvSession(url, message_timeout_s=CALL_TIMEOUT_S) as session:
            return call_of(await session.call_tool(TOOL_NAME, **arguments), started)

    return flat(await asyncio.gather(*(in_rounds(one, rounds) for _ in range(calls))))


def flat(groups: list[list[Call]]) -> list[Call]:
    return [call for group in groups for call in group]


async def in_rounds(call: Callable[[], Awaitable[Call]], rounds: int) -> list[Call]:
    """`rounds` calls one after another, each counted on its own (a failure does not end the caller's rounds)."""
    return [await guarded(call) for _ in range(rounds)]


async def guarded(call: Callable[[], Awaitable[Call]]) -> Call:
    try:
        return await call()
    except Exception as error:  # every failure is counted by its type and message, and printed
        return Call(outcome_of(error))


async def guarded_many(calls: Awaitable[list[Call]], count: int) -> list[Call]:
    """A session that fails as a whole (its connection, its handshake) fails each of its calls."""
    try:
        return await calls
    except Exception as error:  # every failure is counted by its type and message, and printed
        return [Call(f"session {outcome_of(error)}")] * count


async def measure(
    url: str, pid: int, transport: str, calls: int, calls_per_session: int, rounds: int = 1, *, model_url: str
) -> Measured:
    arguments = demo_request(model_url).model_dump(mode="json")
    run: Callable[[int, int], Awaitable[list[Call]]]
    if transport == "mcp":
        run = lambda count, rounds: mcp_calls(url, arguments, count, calls_per_session, rounds)  # noqa: E731
    else:
        run = lambda count, rounds: ws_calls(url, arguments, count, rounds)  # noqa: E731
    measured = Measured(transport, calls * rounds)
    async with httpx.AsyncClient(timeout=300) as http:
        warm_up = [call.outcome for call in await run(1, 1)]  # imports, first-call paths, schema caches: paid first
        if warm_up != ["completed"]:
            raise RuntimeError(f"the warm-up call did not complete: {warm_up}")
        await asyncio.sleep(1.0)
        await http.get(f"{url}/bench/lag")  # starts the lag monitor
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.health_probe", url, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        await asyncio.sleep(1.0)
        idle_cpu, idle_from = cpu_seconds(pid), time.perf_counter()
        await asyncio.sleep(IDLE_WINDOW_S)
        measured.idle_cpu_per_s = (cpu_seconds(pid) - idle_cpu) / (time.perf_counter() - idle_from)
        await http.get(f"{url}/bench/lag")  # what the monitor saw while idle is dropped
        measured.idle_rss_kb = proc_status_kb(pid, "VmRSS")
        cpu_before = cpu_seconds(pid)
        started = time.perf_counter()
        done = await run(calls, rounds)
        measured.server_cpu_s = cpu_seconds(pid) - cpu_before
        measured.wall_s = time.perf_counter() - started
        measured.outcomes = Counter(call.outcome for call in done)
        measured.added_s = [call.added_s for call in done if call.added_s is not None]
        measured.load = load_1m()
        out, _ = await probe.communicate(b"")
        probed = json.loads(out)
        measured.health_s, measured.health_timeouts = probed["latencies"], probed["timeouts"]
        watch = (await http.get(f"{url}/bench/lag")).json()
        measured.ticks = [(late, own_cpu, process_cpu) for late, own_cpu, process_cpu in watch["ticks"]]
        measured.gc_pauses = [(generation, pause) for generation, pause in watch["gc_pauses"]]
        measured.peak_rss_kb = max(watch["peak_rss_kb"], measured.idle_rss_kb)
        measured.in_flight_at_peak, measured.max_in_flight = watch["in_flight_at_peak"], watch["max_in_flight"]
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
    p50, p99 = percentile(m.added_s, 0.5), percentile(m.added_s, 0.99)
    print(f"  added to a call: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (the caller's wall less the rollout's)")
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
        f"{m.cpu_per_call_s * 1000:.0f} ms per call beyond its idle {m.idle_cpu_per_s:.0%}); "
        f"GC: {len(m.gc_pauses)} collections, {len(full_pauses)} full, longest "
        f"{max(full_pauses, default=0) * 1000:.0f} ms, {sum(pause for _, pause in m.gc_pauses):.1f}s in all"
    )
    print("  targets: " + ", ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in m.targets().items()))


@dataclass(frozen=True)
class Figures:
    """One variant at one level, over its repeats: CPU per call, RSS peaks and time in the collector (wall time, as
    the server's loop lost it) are medians, latencies pooled."""

    cpu_ms: float
    added_p50_ms: float
    added_p99_ms: float
    peak_rss_mb: float
    gc_ms: float
    failed: int

    @classmethod
    def of(cls, runs: list[Measured]) -> Figures:
        added = [added for run in runs for added in run.added_s]
        return cls(
            cpu_ms=statistics.median(run.cpu_per_call_s * 1000 for run in runs),
            added_p50_ms=percentile(added, 0.5) * 1000,
            added_p99_ms=percentile(added, 0.99) * 1000,
            peak_rss_mb=statistics.median(run.peak_rss_kb / 1024 for run in runs),
            gc_ms=statistics.median(sum(pause for _, pause in run.gc_pauses) / run.calls * 1000 for run in runs),
            failed=sum(run.calls - run.completed for run in runs),
        )


FIGURES = ("cpu_ms", "added_p50_ms", "added_p99_ms", "peak_rss_mb", "gc_ms")


def compare(
    transports: list[str], levels: list[int], variants: list[str], repeats: int, model_url: str, **how: int
) -> None:
    runs: dict[tuple[str, int, str], list[Measured]] = {}
    for repeat in range(repeats):
        for transport, level in itertools.product(transports, levels):
            shift = repeat % len(variants)  # each variant runs first as often as the others
            for variant in variants[shift:] + variants[:shift]:
                with variant_server(variant, level) as (url, pid):
                    measured = asyncio.run(measure(url, pid, transport, level, **how, model_url=model_url))
                runs.setdefault((transport, level, variant), []).append(measured)
                print(
                    f"  run {repeat + 1}/{repeats} {transport} x{level} {variant}: {measured.completed}/"
                    f"{measured.calls} completed, {measured.cpu_per_call_s * 1000:.1f} ms CPU per call,"
                    f" load1 {measured.load:.2f}",
                    flush=True,
                )
    print(f"\nmedians of {repeats} interleaved runs; latency added: pooled p50/p99; ratio = variant / {variants[0]}")
    columns = ("CPU ms/call", "added p50 ms", "added p99 ms", "peak RSS MB", "in GC ms/call")
    header = f"{'':>14}" + "".join(f"{column:>17}" for column in columns) + " failed"
    for transport, level in itertools.product(transports, levels):
        print(f"\n{transport} x{level} in flight\n{header}")
        base = Figures.of(runs[transport, level, variants[0]])
        for variant in variants:
            row = Figures.of(runs[transport, level, variant])
            cells = "".join(_cell(getattr(row, name), getattr(base, name)) for name in FIGURES)
            print(f"{variant.partition('@')[0]:>14}{cells}{row.failed:>7}")


def _cell(value: float, base: float) -> str:
    ratio = f"{value / base:.2f}" if base else "-"
    return f"{value:>10.1f} ({ratio:>4})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="64,256,1000")
    parser.add_argument("--transports", default="mcp,ws")
    parser.add_argument(
        "--calls-per-session", type=int, default=8, help="concurrent calls each MCP client session carries"
    )
    parser.add_argument("--rounds", type=int, default=1, help="calls each caller makes, one after another")
    parser.add_argument(
        "--compare", help=f"variants side by side, the first the base of the ratios: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each variant (with --compare)")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    transports = args.transports.split(",")
    print(f"load1 at start {load_1m():.2f} on {os.cpu_count()} cores")
    # the model each request names: each server probes it once before its first rollout (the latency backend's
    # sandboxes never call it)
    with ScriptedModelServer(demo_script()) as model:
        if args.compare:
            variants = args.compare.split(",")
            how = {"calls_per_session": args.calls_per_session, "rounds": args.rounds}
            compare(transports, levels, variants, args.repeats, model.base_url, **how)
            return
        for transport in transports:
            for calls in levels:
                with server_process(max_rollouts=calls) as (url, pid):
                    how = {"calls_per_session": args.calls_per_session, "rounds": args.rounds}
                    report(asyncio.run(measure(url, pid, transport, calls, **how, model_url=model.base_url)))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
