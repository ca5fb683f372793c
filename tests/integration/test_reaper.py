"""A server killed with sandboxes open leaves trees, mounts and cgroups; the next backend reaps them, and only them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend
from opencode_env.sandbox.local.isolation.cgroup import CGROUP_ROOT, PARENT, detect
from opencode_env.sandbox.local.tools import cached_tools

KILLED_SERVER = """
import asyncio, sys
from pathlib import Path
from opencode_env.sandbox.local.tools import cached_tools
from opencode_env.sandbox.base import SandboxSpec
from opencode_env.sandbox.local.backend import LocalBackend

async def main():
    sandbox = await LocalBackend(cached_tools, base_dir=Path(sys.argv[1])).create(SandboxSpec())
    await sandbox.run("nohup sleep 600 > /dev/null 2>&1 &", timeout_s=10, keep_background=True)
    print(sandbox.root, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def mounted(path: Path) -> bool:
    return str(path) in Path("/proc/self/mounts").read_text()


def cgroups_of(rollout: str) -> list[Path]:
    """Every cgroup named for the rollout (its own, its proxy's, its services' freezer), under either version."""
    return [*CGROUP_ROOT.glob(f"*/{PARENT}/{rollout}*"), *CGROUP_ROOT.glob(f"{PARENT}/{rollout}*")]


async def test_a_killed_servers_sandboxes_are_reaped_and_live_ones_kept(tmp_path: Path) -> None:
    base = tmp_path / "sandboxes"
    base.mkdir()
    live_backend = LocalBackend(cached_tools, base_dir=base)
    live = await live_backend.create(SandboxSpec())
    server = subprocess.Popen([sys.executable, "-c", KILLED_SERVER, str(base)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        orphan = Path((await asyncio.to_thread(server.stdout.readline)).strip())
        assert orphan.is_dir()
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    assert mounted(orphan / "fs")
    assert cgroups_of(orphan.name) != [] or detect() is None
    newcomer = await LocalBackend(cached_tools, base_dir=base).create(SandboxSpec())
    try:
        assert not orphan.exists()
        assert not mounted(orphan / "fs")
        assert cgroups_of(orphan.name) == []
        assert cgroups_of(live.root.name) != [] or detect() is None
        assert live.root.is_dir()
        assert (await live.run("echo alive", timeout_s=10)).stdout == "alive\n"
    finally:
        await newcomer.close()
        await live.close()
    assert list(base.iterdir()) == []
