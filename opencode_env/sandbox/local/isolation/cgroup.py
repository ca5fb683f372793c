"""Per-rollout resource limits with cgroups: v2 (one unified tree) or v1 (memory, pids, cpu controllers).

A rollout's cgroup counts everything the rollout runs (the holder, setup's services, the agent, verify). Processes
join it before they exec (`join_prefix`), so nothing runs a moment outside it. Which limit was hit is read back
from the kernel's own counters.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from opencode_env.wire import LimitHit

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "opencode-env"
CPU_PERIOD_US = 100_000

CgroupVersion = Literal["v2", "v1"]


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    max_processes: int
    cpus: float


def detect() -> CgroupVersion | None:
    """The cgroup version we can write to (as root), or None when neither is usable."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return "v2" if os.access(CGROUP_ROOT, os.W_OK) else None
    needed = [CGROUP_ROOT / name for name in ("memory", "pids")]
    return "v1" if all(os.access(path, os.W_OK) for path in needed) else None


PROXY_LIMITS = Limits(memory_bytes=512 * 2**20, max_processes=64, cpus=1.0)
"""The capture proxy's own cgroup, beside its rollout's: what it holds is bounded (request bodies are capped at
32 MiB), and an agent that exhausts its own memory or processes cannot take the proxy down with it."""


def proxy_cgroup_name(rollout: str) -> str:
    return f"{rollout}-proxy"


class Cgroup:
    def __init__(self, name: str, version: CgroupVersion) -> None:
        self.name = name
        self.version = version
        if version == "v2":
            self._dirs = {"unified": CGROUP_ROOT / PARENT / name}
        else:
            controllers = ["memory", "pids"] + (["cpu"] if os.access(CGROUP_ROOT / "cpu", os.W_OK) else [])
            self._dirs = {controller: CGROUP_ROOT / controller / PARENT / name for controller in controllers}

    def create(self, limits: Limits) -> None:
        if self.version == "v2":
            parent = CGROUP_ROOT / PARENT
            parent.mkdir(exist_ok=True)
            _write_quietly(CGROUP_ROOT / "cgroup.subtree_control", "+memory +pids +cpu")
            (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
        for directory in self._dirs.values():
            directory.mkdir(parents=True, exist_ok=True)
        self._apply(limits)

    def _apply(self, limits: Limits) -> None:
        quota = f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}"
        if self.version == "v2":
            unified = self._dirs["unified"]
            (unified / "memory.max").write_text(str(limits.memory_bytes))
            _write_quietly(unified / "memory.swap.max", "0")
            (unified / "pids.max").write_text(str(limits.max_processes))
            _write_quietly(unified / "cpu.max", quota)
            return
        memory = self._dirs["memory"]
        (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        _write_quietly(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        (self._dirs["pids"] / "pids.max").write_text(str(limits.max_processes))
        if "cpu" in self._dirs:
            _write_quietly(self._dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write_quietly(self._dirs["cpu"] / "cpu.cfs_quota_us", str(int(limits.cpus * CPU_PERIOD_US)))

    def procs_files(self) -> list[str]:
        return [str(directory / "cgroup.procs") for directory in self._dirs.values()]

    def join_prefix(self, *also: str) -> list[str]:
        """An argv prefix that moves the process into this cgroup (then into each of the `also` procs files, in
        order), then execs the rest of the argv."""
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "cgroup-join", *self.procs_files(), *also, "--"]

    def limits_hit(self) -> list[LimitHit]:
        """Which limits the kernel enforced so far: 'memory' (an OOM kill), 'processes' (a refused fork)."""
        hit: list[LimitHit] = []
        if self.version == "v2":
            unified = self._dirs["unified"]
            if _counter(unified / "memory.events", "oom_kill") > 0:
                hit.append("memory")
            if _counter(unified / "pids.events", "max") > 0:
                hit.append("processes")
            return hit
        if _counter(self._dirs["memory"] / "memory.oom_control", "oom_kill") > 0:
            hit.append("memory")
        if _counter(self._dirs["pids"] / "pids.events", "max") > 0:
            hit.append("processes")
        return hit

    def pids(self) -> list[int]:
        directory = next(iter(self._dirs.values()))
        try:
            return [int(line) for line in (directory / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def destroy(self) -> None:
        """Kill whatever is still inside, then remove the cgroup directories."""
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for directory in self._dirs.values():
            _remove_when_empty(directory)


FREEZE_WAIT_S = 10.0


class ServicesFreezer:
    """The cgroup of what setup leaves running (its services), inside the rollout's limits, that can be frozen: from
    before the host removes OpenCode's project configuration until OpenCode has loaded its own, so no process of the
    task's can plant configuration in between (a frozen process runs no instruction; its children are born in the
    same cgroup). v1: a cgroup of the freezer hierarchy; v2: a child of the rollout's cgroup (cgroup.freeze)."""

    def __init__(self, rollout: str, version: CgroupVersion) -> None:
        self.version = version
        if version == "v2":
            self._dir = CGROUP_ROOT / PARENT / rollout / "services"
        else:
            self._dir = CGROUP_ROOT / "freezer" / PARENT / f"{rollout}-services"

    @staticmethod
    def available(version: CgroupVersion) -> bool:
        return version == "v2" or os.access(CGROUP_ROOT / "freezer", os.W_OK)

    def create(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)

    def procs_file(self) -> str:
        return str(self._dir / "cgroup.procs")

    def freeze(self) -> None:
        """Freeze every process inside and wait until the kernel says all are frozen."""
        self._set(frozen=True)
        deadline = time.monotonic() + FREEZE_WAIT_S
        while not self.frozen():
            if time.monotonic() > deadline:
                raise OSError(f"setup's processes in {self._dir} did not freeze within {FREEZE_WAIT_S:.0f} s")
            time.sleep(0.005)

    def thaw(self) -> None:
        self._set(frozen=False)

    def frozen(self) -> bool:
        if self.version == "v2":
            return _counter(self._dir / "cgroup.events", "frozen") == 1
        return (self._dir / "freezer.state").read_text().strip() == "FROZEN"

    def _set(self, *, frozen: bool) -> None:
        if self.version == "v2":
            (self._dir / "cgroup.freeze").write_text("1" if frozen else "0")
        else:
            (self._dir / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    def destroy(self) -> None:
        """Thawed first (a frozen process does not die of SIGKILL), then emptied and removed."""
        if not self._dir.exists():
            return
        self.thaw()
        for _ in range(50):
            try:
                pids = [int(line) for line in (self._dir / "cgroup.procs").read_text().split()]
            except FileNotFoundError:
                return
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _remove_when_empty(self._dir)


def cgroup_prefix(cgroup: Cgroup | None) -> list[str]:
    """The argv prefix that starts a program in `cgroup`; nothing without one (no writable cgroup)."""
    return cgroup.join_prefix() if cgroup is not None else []


def _remove_when_empty(directory: Path) -> None:
    """rmdir fails with EBUSY while killed processes are still exiting: retry for a short while."""
    for _ in range(200):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY:
                raise
            time.sleep(0.01)
    directory.rmdir()


def _counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except FileNotFoundError:
        return 0
    return 0


def _write_quietly(path: Path, value: str) -> None:
    """Settings some kernels lack (swap accounting, a cpu controller): applied where they exist."""
    with contextlib.suppress(OSError):
        path.write_text(value)
