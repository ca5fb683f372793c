"""What starting every local sandbox command from our own files costs: one command's wall time (`true`, as each
identity, on the base image), and one tool call's (the agent's tools' shell), measured here side by side with the
command chain as it is; run it on a checkout before and after a change of the chain to compare.

    uv run --frozen python -m bench.trusted_start
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.isolation.command_argv import TOOL_SHELL
from opencode_env.sandbox.local.tools import cached_tools

ROUNDS = 15


async def _timed(sandbox: object, command: str, identity: str) -> float:
    started = time.perf_counter()
    ran = await sandbox.run(command, timeout_s=60, identity=identity)  # type: ignore[attr-defined]
    assert ran.exit_code == 0, ran.stderr
    return time.perf_counter() - started


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-trusted-") as base:
        await measure(LocalBackend(cached_tools, base_dir=Path(base)))


async def measure(backend: LocalBackend) -> None:
    sandbox = await backend.create(SandboxSpec(image=build_base_image()))
    try:
        cases = {
            "user: true": ("true", "user"),
            "root: true": ("true", "root"),
            "grader: true": ("true", "grader"),
            "agent: its tools' shell, true": (f"{TOOL_SHELL} -c true", "agent"),
        }
        for name, (command, identity) in cases.items():
            times = [await _timed(sandbox, command, identity) for _ in range(ROUNDS)]
            print(f"{name:32s} median {statistics.median(times) * 1000:7.1f} ms  best {min(times) * 1000:7.1f} ms")
    finally:
        await sandbox.close()


if __name__ == "__main__":
    asyncio.run(main())
