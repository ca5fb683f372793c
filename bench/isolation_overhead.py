"""What the local backend's isolation costs per rollout, side by side with bubblewrap alone.

`uv run python -m bench.isolation_overhead [--runs 20]` (as root). Interleaved, one run each per round:
- bwrap alone: one `bwrap ... true` as the old backend spawned per command (no holder, no uid, no network, no
  limits, no disk);
- sandbox create + close: the whole per-rollout cost now (uid lease, loop ext4, cgroup, holder, egress proxy,
  teardown), with one `true` command run inside;
- one command: a command in an existing sandbox (nsenter + setpriv + unshare) against bwrap alone.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.stats import spread
from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.tools import cached_tools

BWRAP = ["bwrap", "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--", "true"]


async def bwrap_alone() -> float:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*BWRAP)
    await process.wait()
    return time.perf_counter() - started


async def sandbox_lifetime(backend: LocalBackend) -> tuple[float, float, float]:
    started = time.perf_counter()
    sandbox = await backend.create(SandboxSpec())
    created = time.perf_counter()
    await sandbox.run("true", timeout_s=30)
    ran = time.perf_counter()
    await sandbox.close()
    closed = time.perf_counter()
    return created - started, ran - created, closed - ran


async def main(runs: int) -> None:
    await cached_tools()
    with tempfile.TemporaryDirectory() as base:
        backend = LocalBackend(cached_tools, base_dir=Path(base))
        alone, create, command, close = [], [], [], []
        for _ in range(runs):
            alone.append(await bwrap_alone())
            made, ran, closed = await sandbox_lifetime(backend)
            create.append(made)
            command.append(ran)
            close.append(closed)
    total = [a + b + c for a, b, c in zip(create, command, close, strict=True)]
    print(f"{runs} interleaved runs")
    print(f"bwrap alone (one command)     {spread(alone)}")
    print(f"sandbox create                {spread(create)}")
    print(f"one command in the sandbox    {spread(command)}")
    print(f"sandbox close                 {spread(close)}")
    print(f"create + command + close      {spread(total)}")
    added = statistics.median(total) - statistics.median(alone)
    print(
        f"added per rollout vs bwrap alone: {added * 1000:.1f} ms (median); per command: "
        f"{statistics.median(command) / statistics.median(alone):.2f}x bwrap alone"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
