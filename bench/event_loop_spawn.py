"""What the event loop under a rollout costs it: oracle rollouts on the local backend in a process on uvloop against
one on the standard library's loop, each process as large as a server or a Ray runner, side by side in one run.

    uv run python -m bench.event_loop_spawn [--pairs 20] [--rss-mib 200] [--spawns 200]

uvloop starts a subprocess with a fork of the whole process (libuv), so each spawn copies the page tables of
everything the process holds; the standard loop spawns through `_posixsubprocess` with vfork, which copies nothing.
A rollout starts dozens of subprocesses (the sandbox, its commands, the grader's box), so the difference grows with
the process: the server idles at about 200 MiB, a Ray runner's worker at about as much. Both run rollouts on the
standard loop (server/app.py's UVICORN_OPTIONS, cluster/node.py's RUNNER_ENV); the capture proxy, which starts no
subprocess, keeps uvloop.

Two workers (this module with --worker LOOP), each holding --rss-mib of touched memory, run --pairs oracle rollouts
each, interleaved one by one after a warm-up. Printed per rollout: CPU seconds (the worker and its waited-for
children: the sandboxes) and wall seconds, mean and 95% bootstrap interval, and the ratio; then --spawns bare spawns
of /bin/true in each worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

from bench.rollout_measure import cpu_s, load_line, oracle
from bench.stats import mean_ci
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import make_backend
from opencode_env.wire import RolloutRequest, RolloutResult

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


def worker(loop: str, rss_mib: int) -> None:
    """Each line on stdin: `rollout REQUEST_JSON` or `spawns N`; each answer a JSON line on stdout."""
    ballast = bytearray(rss_mib * 2**20)
    for offset in range(0, len(ballast), 4096):
        ballast[offset] = 1
    backend = make_backend("local")

    async def serve() -> None:
        for line in sys.stdin:
            kind, _, argument = line.partition(" ")
            before, started = cpu_s(os.getpid(), children=True), time.monotonic()
            answer: dict[str, Any] = {}
            if kind == "rollout":
                result = await run_rollout(RolloutRequest.model_validate_json(argument), backend)
                answer["result"] = result.model_dump_json()
            else:
                for _ in range(int(argument)):
                    process = await asyncio.create_subprocess_exec("/bin/true")
                    await process.wait()
            answer |= {"wall_s": time.monotonic() - started, "cpu_s": cpu_s(os.getpid(), children=True) - before}
            print(json.dumps(answer), flush=True)

    LOOPS[loop](serve())


class Worker:
    def __init__(self, loop: str, rss_mib: int) -> None:
        command = [sys.executable, "-m", "bench.event_loop_spawn", "--worker", loop, str(rss_mib)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def rollout(self, request: RolloutRequest) -> tuple[float, float]:
        answer = self.ask(f"rollout {request.model_dump_json()}")
        result = RolloutResult.model_validate_json(answer["result"])
        if (result.status, result.reward) != ("completed", 1.0):
            raise SystemExit(f"an oracle rollout did not pass: {result.status} {result.error}")
        return answer["cpu_s"], answer["wall_s"]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def bench(args: argparse.Namespace) -> None:
    print(f"at start: {load_line()}")
    workers = {loop: Worker(loop, args.rss_mib) for loop in LOOPS}
    figures: dict[str, dict[str, list[float]]] = {loop: {"cpu": [], "wall": []} for loop in LOOPS}
    try:
        for index in range(args.pairs + 1):
            for loop, each in workers.items():
                cpu, wall = each.rollout(oracle(f"{loop}-{index}"))
                if index:  # the first warms the worker's caches
                    figures[loop]["cpu"].append(cpu)
                    figures[loop]["wall"].append(wall)
        spawns = {loop: each.ask(f"spawns {args.spawns}") for loop, each in workers.items()}
    finally:
        for each in workers.values():
            each.close()
    print(f"\nper oracle rollout, {args.pairs} interleaved pairs, each worker holding {args.rss_mib} MiB")
    for loop in LOOPS:
        print(f"{loop:8} CPU s  {mean_ci(figures[loop]['cpu'])}")
        print(f"{loop:8} wall s {mean_ci(figures[loop]['wall'])}")
    for measure in ("cpu", "wall"):
        ratio = statistics.fmean(figures["uvloop"][measure]) / statistics.fmean(figures["asyncio"][measure])
        print(f"uvloop / asyncio, {measure}: {ratio:.3f}")
    print(f"\n{args.spawns} spawns of /bin/true, per spawn")
    for loop, answer in spawns.items():
        cpu_ms, wall_ms = answer["cpu_s"] / args.spawns * 1000, answer["wall_s"] / args.spawns * 1000
        print(f"{loop:8} CPU {cpu_ms:6.2f} ms  wall {wall_ms:6.2f} ms")
    print(f"at end: {load_line()}")


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20, help="interleaved rollouts on each loop (default 20)")
    parser.add_argument("--rss-mib", type=int, default=200, help="memory each worker holds (default 200)")
    parser.add_argument("--spawns", type=int, default=200, help="bare spawns on each loop (default 200)")
    bench(parser.parse_args())


if __name__ == "__main__":
    main()
