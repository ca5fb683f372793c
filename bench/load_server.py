"""The server as `bench.server_load` runs it: the real app on the latency-only backend, the rollout cap raised, and a
bench-only route reporting how late the server's own event loop wakes a task that sleeps 10 ms.

    python -m bench.load_server PORT MAX_ROLLOUTS

The garbage collector and uvicorn are set as the server sets them (server.heap, server.app.UVICORN_OPTIONS). With
BENCH_PROFILE=FILE in its environment, the server runs under cProfile and writes its stats there at exit. To compare
with what the server does not do (bench.server_load --compare): BENCH_GC=defaults leaves CPython's collector settings
as they are, BENCH_GC=frozen also freezes the heap alive once the app is built (`gc.freeze`), and BENCH_WS_DEFLATE=1
turns per-message deflate on, and BENCH_LOOP=uvloop runs it on uvloop.

GET /bench/lag answers what was seen since the previous GET (see Watch): the ticks, each as [seconds late, CPU
seconds the loop's own thread used during the tick, CPU seconds the whole process used] (a late tick whose loop
thread was busy is work blocking the loop; one whose loop thread was idle waited for a CPU or another thread's GIL),
the garbage collector's pauses, the peak RSS and the rollouts in flight then, and the most rollouts in flight.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import itertools
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

from bench.latency_backend import LatencyBackend
from opencode_env.server import heap
from opencode_env.server.app import UVICORN_OPTIONS, create_app
from opencode_env.server.rollouts import Rollouts
from opencode_env.server.runtime import Runtime
from opencode_env.settings import Settings

TICK_S = 0.010


@dataclass
class Watch:
    """What the monitor saw since it was last read."""

    ticks: list[tuple[float, float, float]] = field(default_factory=list)
    gc_pauses: list[tuple[int, float]] = field(default_factory=list)
    peak_rss_kb: int = 0
    in_flight_at_peak: int = 0
    max_in_flight: int = 0


class LagMonitor:
    """Ticks every 10 ms on the server's loop; also follows RSS against rollouts in flight, and garbage collections."""

    def __init__(self, rollouts: Rollouts) -> None:
        self.watch = Watch()
        self._rollouts = rollouts
        self._task: asyncio.Task[None] | None = None
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.watch.gc_pauses.append((info["generation"], time.perf_counter() - self._gc_started))

    def ensure_running(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        for tick in itertools.count():
            before, thread_before, process_before = time.perf_counter(), time.thread_time(), time.process_time()
            await asyncio.sleep(TICK_S)
            late = time.perf_counter() - before - TICK_S
            watch = self.watch
            watch.ticks.append((late, time.thread_time() - thread_before, time.process_time() - process_before))
            watch.max_in_flight = max(watch.max_in_flight, self._rollouts.in_flight)
            if tick % 5 == 0 and (rss := rss_kb()) > watch.peak_rss_kb:
                watch.peak_rss_kb, watch.in_flight_at_peak = rss, self._rollouts.in_flight

    def take(self) -> Watch:
        watch, self.watch = self.watch, Watch()
        return watch


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def bench_app(max_rollouts: int) -> FastAPI:
    runtime = Runtime.build(
        Settings.load().model_copy(update={"token": SecretStr("")}),
        backend=LatencyBackend(),
        max_rollouts=max_rollouts,
        keep_results=False,
    )
    app = create_app(runtime)
    collector = os.environ.get("BENCH_GC", "settled")
    if collector != "defaults":
        heap.settle()
    if collector == "frozen":
        gc.collect()
        gc.freeze()
    monitor = LagMonitor(runtime.rollouts)

    @app.get("/bench/lag")
    async def lag() -> dict[str, object]:
        monitor.ensure_running()
        return {**asdict(monitor.take()), "rss_kb": rss_kb()}

    return app


def main() -> None:
    port, max_rollouts = int(sys.argv[1]), int(sys.argv[2])
    app = bench_app(max_rollouts)
    profile_path = os.environ.get("BENCH_PROFILE")
    if not profile_path:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", **uvicorn_options())
        return
    # uvicorn raises the SIGTERM it caught again once it has shut down: exit through Python, so the stats are written.
    signal.signal(signal.SIGTERM, exit_on_signal)
    profiler = cProfile.Profile()
    try:
        profiler.runcall(uvicorn.run, app, host="127.0.0.1", port=port, log_level="warning", **uvicorn_options())
    finally:
        profiler.dump_stats(profile_path)


def uvicorn_options() -> dict[str, object]:
    """The server's own uvicorn options; to compare, BENCH_WS_DEFLATE=1 turns per-message deflate back on and
    BENCH_LOOP names another event loop (uvloop)."""
    return {
        **UVICORN_OPTIONS,
        "ws_per_message_deflate": os.environ.get("BENCH_WS_DEFLATE") == "1",
        "loop": os.environ.get("BENCH_LOOP", UVICORN_OPTIONS["loop"]),
    }


def exit_on_signal(sig: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + sig)


if __name__ == "__main__":
    main()
