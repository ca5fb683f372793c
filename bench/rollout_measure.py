"""What the rollout benches share: the oracle request, a process's CPU seconds read from /proc, the machine's load."""

from __future__ import annotations

import os
from pathlib import Path

from opencode_env.wire import RolloutRequest

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
