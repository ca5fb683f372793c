"""What the rollout benches share: the oracle request, a process's CPU seconds read from /proc, the machine's load,
and a worker process that runs rollouts on the local backend."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import uvloop

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox import make_backend
from opencode_env.wire import RolloutRequest, RolloutResult

TICK = os.sysconf("SC_CLK_TCK")

WORKDIR = "/home/user/workdir"


def oracle(task_id: str) -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            "instruction": "Write 42 to answer.txt",
            "task_id": task_id,
            "verify": [f'cd {WORKDIR} && test "$(cat answer.txt)" = 42'],
            "solution": [f"echo 42 > {WORKDIR}/answer.txt"],
        }
    )


def check(result: RolloutResult) -> None:
    """A bench measures rollouts that passed: any other ends the bench."""
    if (result.status, result.reward) != ("completed", 1.0):
        raise SystemExit(f"a bench rollout failed: {result.status} {result.error}")


def cpu_s(pid: int, *, children: bool) -> float:
    """A process's CPU seconds from /proc (user + system, and its waited-for children's with `children`)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / TICK


def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


class RolloutWorker:
    """Rollouts on the local backend in a Python process of its own (no Ray in it), on the event loop named (asyncio
    or uvloop), holding `rss_mib` of touched memory: `python -m bench.rollout_measure LOOP RSS_MIB`."""

    def __init__(self, loop: str = "asyncio", rss_mib: int = 0) -> None:
        command = [sys.executable, "-m", "bench.rollout_measure", loop, str(rss_mib)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def rollout(self, request: RolloutRequest) -> tuple[RolloutResult, float, float]:
        """The result, its wall seconds and the CPU seconds of the worker and its sandboxes."""
        answer = self._ask(f"rollout {request.model_dump_json()}")
        return RolloutResult.model_validate_json(answer["result"]), answer["wall_s"], answer["cpu_s"]

    def spawns(self, count: int) -> tuple[float, float]:
        """`count` spawns of /bin/true one after another: wall and CPU seconds in all."""
        answer = self._ask(f"spawns {count}")
        return answer["wall_s"], answer["cpu_s"]

    def _ask(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


def serve(loop: str, rss_mib: int) -> None:
    """RolloutWorker's side: each line on stdin `rollout REQUEST_JSON` or `spawns N`, each answer a JSON line."""
    ballast = bytearray(rss_mib * 2**20)
    for offset in range(0, len(ballast), 4096):
        ballast[offset] = 1
    backend = make_backend("local")

    async def answer_each() -> None:
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

    LOOPS[loop](answer_each())


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
