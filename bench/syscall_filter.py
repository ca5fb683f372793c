"""What the syscall filter costs a sandbox command, side by side in one run.

`uv run python -m bench.syscall_filter [--runs 30]` (as root). In one sandbox on the host's root, interleaved:
- a command: `true` as every sandbox command runs (nsenter, the identity's namespaces, the filter's loader, bash);
- the filter's share: the loader alone (`python -I -S seccomp_exec.py FILTER -- true`), timed inside the sandbox;
- building the filter: libseccomp compiling the BPF program (once per server process).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.stats import spread
from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.images.store import HOST_IMAGE
from opencode_env.sandbox.local.isolation.bubblewrap import CONTROL_MOUNT, SECCOMP_EXEC, SYSCALL_FILTER
from opencode_env.sandbox.local.isolation.syscall_filter import filter_program
from opencode_env.sandbox.local.tools import cached_tools

LOADER_ALONE = (
    f"s=$(date +%s%N); {os.path.realpath(sys.executable)} -I -S {CONTROL_MOUNT}/{SECCOMP_EXEC} "
    f"{CONTROL_MOUNT}/{SYSCALL_FILTER} -- true; echo $(( $(date +%s%N) - s ))"
)


async def main(runs: int) -> None:
    started = time.perf_counter()
    filter_program.__wrapped__()
    build_s = time.perf_counter() - started
    await cached_tools()
    with tempfile.TemporaryDirectory() as base:
        backend = LocalBackend(cached_tools, base_dir=Path(base))
        sandbox = await backend.create(SandboxSpec(image=HOST_IMAGE))
        command, loader = [], []
        try:
            for _ in range(runs):
                began = time.perf_counter()
                assert (await sandbox.run("true", timeout_s=30)).exit_code == 0
                command.append(time.perf_counter() - began)
                timed = await sandbox.run(LOADER_ALONE, timeout_s=30)
                loader.append(int(timed.stdout.strip()) / 1e9)
        finally:
            await sandbox.close()
    print(f"a sandbox command and the syscall filter's share of it, {runs} runs, interleaved")
    print(f"  one command (true)          {spread(command)}")
    print(f"  the filter's loader alone   {spread(loader)}")
    print(
        f"  share: {statistics.median(loader) / statistics.median(command):.0%} of a command at p50; "
        f"building the filter once: {build_s * 1000:.1f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args().runs))
