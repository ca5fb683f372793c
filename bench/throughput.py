"""Throughput of real rollouts: N demo-task rollouts (real OpenCode on the local backend, each against its own
scripted model) at each concurrency level, run in this process and through a server, side by side.

    uv run python -m bench.throughput [--rollouts 8] [--levels 1,2,4,8] [--paths in-process,server]

For each level and path: rollouts per minute (N over the batch's wall time), p50/p95 of a rollout's own wall time
(RolloutResult.wall_s, the pipeline's clock on either path), the median seconds of each phase, and peak memory per
concurrent rollout: of the process that runs the pipeline (this one, or the server) and of everything it spawned
(bubblewrap, OpenCode, the capture proxy). The server path is the client's batch call, OpenCodeEnv.run_rollouts, over
the WebSocket; the server is one process (the local backend, the cap at the highest level) kept for every level.
Each level starts from the memory the previous one left, so growth at later levels is a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.serving import free_port, running_server
from opencode_env.client.client import OpenCodeEnv
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools, install_cached
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.wire import RolloutRequest, RolloutResult

PHASES = ("sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect", "close")
Runner = Callable[[list[RolloutRequest], int], Coroutine[Any, Any, list[RolloutResult]]]


def load_1m() -> float:
    return os.getloadavg()[0]


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0  # the process exited between the listing and the read
    return 0  # a zombie has no VmRSS


def descendants(root: int, skip: frozenset[int] = frozenset()) -> list[int]:
    """Every process under root, leaving out the subtrees of `skip`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(), []):
            if child in skip:
                continue
            found.append(child)
            pending.append(child)
    return found


class MemorySampler:
    """Peak RSS of one process, and of the processes under it (but `skip`), sampled from a thread every 0.25 s."""

    def __init__(self, pid: int, skip: frozenset[int]) -> None:
        self.pid = pid
        self.skip = skip
        self.base_kb = rss_kb(pid)
        self.peak_kb = self.base_kb
        self.peak_tree_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.peak_kb = max(self.peak_kb, rss_kb(self.pid))
            self.peak_tree_kb = max(self.peak_tree_kb, sum(rss_kb(child) for child in descendants(self.pid, self.skip)))

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Level:
    path: str
    concurrency: int
    results: list[RolloutResult] = field(default_factory=list)
    wall_s: float = 0.0
    load: float = 0.0
    rss_growth_kb: int = 0
    tree_peak_kb: int = 0

    def line(self) -> str:
        walls = sorted(result.wall_s for result in self.results)
        statuses = Counter(result.status for result in self.results)
        p95 = walls[min(int(0.95 * len(walls)), len(walls) - 1)]
        per_rollout_mb = self.rss_growth_kb / self.concurrency / 1024
        tree_mb = self.tree_peak_kb / self.concurrency / 1024
        result_kb = statistics.median(len(result.model_dump_json()) for result in self.results) / 1024
        return (
            f"{self.path:<11}{self.concurrency:>3}{len(self.results) * 60 / self.wall_s:>9.1f}"
            f"{statistics.median(walls):>7.2f}{p95:>7.2f}{per_rollout_mb:>10.1f}{tree_mb:>10.0f}"
            f"{result_kb:>8.0f}{self.load:>7.2f}  {dict(statuses)}"
        )

    def phases(self) -> str:
        medians = []
        for phase in PHASES:
            values = [getattr(result.timings, f"{phase}_s") for result in self.results]
            present = [value for value in values if value is not None]
            if present:
                medians.append(f"{phase} {statistics.median(present):.2f}")
        return f"{self.path:<11}{self.concurrency:>3}  " + ", ".join(medians)


async def in_process(backend: LocalBackend, requests: list[RolloutRequest], concurrency: int) -> list[RolloutResult]:
    slots = asyncio.Semaphore(concurrency)

    async def one(request: RolloutRequest) -> RolloutResult:
        async with slots:
            return await run_rollout(request, backend)

    return list(await asyncio.gather(*(one(request) for request in requests)))


async def through_server(url: str, requests: list[RolloutRequest], concurrency: int) -> list[RolloutResult]:
    async with OpenCodeEnv(base_url=url) as env:
        return await env.run_rollouts(requests, max_concurrency=concurrency, progress=False)


def measure(path: str, pid: int, skip: frozenset[int], runner: Runner, count: int, concurrency: int) -> Level:
    """`count` rollouts, each against a scripted model of its own (a model answers one conversation)."""
    with ExitStack() as stack:
        models = [stack.enter_context(ScriptedModelServer(demo_script())) for _ in range(count)]
        requests = [demo_request(model.base_url) for model in models]
        with MemorySampler(pid, skip) as memory:
            started = time.perf_counter()
            results = asyncio.run(runner(requests, concurrency))
            wall = time.perf_counter() - started
    return Level(path, concurrency, results, wall, load_1m(), memory.peak_kb - memory.base_kb, memory.peak_tree_kb)


@contextmanager
def local_server(max_rollouts: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {
        **os.environ,
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "OPENCODE_ENV_BACKEND": "local",
        "MAX_CONCURRENT_ENVS": str(max_rollouts),
    }
    url = f"http://127.0.0.1:{port}"
    with running_server(
        [sys.executable, "-m", "opencode_env.server.app"], f"{url}/metadata", env=env, quiet=True
    ) as pid:
        yield url, pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--paths", default="in-process,server")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    paths = args.paths.split(",")
    install_cached()
    backend = LocalBackend(cached_tools)
    measured: list[Level] = []
    print(f"{args.rollouts} demo rollouts per level; load1 at start {load_1m():.2f} on {os.cpu_count()} cores")
    print("MB/roll: growth of the pipeline's process; tree MB: its children (OpenCode, proxies), both per rollout")
    header = f"{'path':<11}{'c':>3}{'per min':>9}{'p50 s':>7}{'p95 s':>7}{'MB/roll':>10}{'tree MB':>10}{'res KB':>8}"
    print(f"{header}{'load1':>7}")
    with local_server(max(levels)) as (url, server_pid):
        for concurrency in levels:
            for path in paths:
                if path == "in-process":
                    runner: Runner = lambda requests, c: in_process(backend, requests, c)  # noqa: E731
                    level = measure(path, os.getpid(), frozenset({server_pid}), runner, args.rollouts, concurrency)
                else:
                    runner = lambda requests, c: through_server(url, requests, c)  # noqa: E731
                    level = measure(path, server_pid, frozenset(), runner, args.rollouts, concurrency)
                measured.append(level)
                print(level.line(), flush=True)
    print("median seconds per phase")
    for level in measured:
        print(level.phases())


if __name__ == "__main__":
    main()
