"""The server as `bench.server_load` runs it: the real app on the latency-only backend, the rollout cap raised, and a
bench-only route reporting how late the server's own event loop wakes a task that sleeps 10 ms.

    python -m bench.load_server PORT MAX_ROLLOUTS

With BENCH_PROFILE=FILE in its environment, the server runs under cProfile and writes its stats there at exit.

GET /bench/lag answers the ticks recorded since the previous GET, each as [seconds late, CPU seconds the loop's own
thread used during the tick, CPU seconds the whole process used]: a late tick whose loop thread was busy is work
blocking the loop; one whose loop thread was idle waited for a CPU (or another thread's GIL).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from bench.latency_backend import LatencyBackend
from server.app import build_app
from server.environment import configure

TICK_S = 0.010


class LagMonitor:
    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._task: asyncio.Task[None] | None = None

    def ensure_running(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            before, thread_before, process_before = time.perf_counter(), time.thread_time(), time.process_time()
            await asyncio.sleep(TICK_S)
            late = time.perf_counter() - before - TICK_S
            self.samples.append((late, time.thread_time() - thread_before, time.process_time() - process_before))

    def take(self) -> list[tuple[float, float, float]]:
        samples, self.samples = self.samples, []
        return samples


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def bench_app(max_rollouts: int) -> FastAPI:
    configure(LatencyBackend(), max_rollouts=max_rollouts)
    app = build_app(token="")
    monitor = LagMonitor()

    @app.get("/bench/lag")
    async def lag() -> dict[str, object]:
        monitor.ensure_running()
        return {"ticks": monitor.take(), "rss_kb": rss_kb()}

    return app


def main() -> None:
    port, max_rollouts = int(sys.argv[1]), int(sys.argv[2])
    app = bench_app(max_rollouts)
    profile_path = os.environ.get("BENCH_PROFILE")
    if not profile_path:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
        return
    # uvicorn raises the SIGTERM it caught again once it has shut down: exit through Python, so the stats are written.
    signal.signal(signal.SIGTERM, exit_on_signal)
    profiler = cProfile.Profile()
    try:
        profiler.runcall(uvicorn.run, app, host="127.0.0.1", port=port, log_level="warning")
    finally:
        profiler.dump_stats(profile_path)


def exit_on_signal(sig: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + sig)


if __name__ == "__main__":
    main()
