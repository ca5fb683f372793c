"""Memory admission for the local backend: sandboxes whose memory limits (their own plus their proxy's) would add up
beyond what this machine can give wait for room, in arrival order, within their caller's deadline; one that could
never fit is refused at once. The budget is the machine's memory times an overcommit factor
(OPENCODE_ENV_MEMORY_OVERCOMMIT, default 4: a limit is a ceiling most rollouts never reach)."""

from __future__ import annotations

from pathlib import Path

from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.reservations import Reservations
from opencode_env.settings import variable

DEFAULT_OVERCOMMIT = 4.0


def machine_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise SandboxError("cannot read MemTotal from /proc/meminfo")


def memory_budget_mb(overcommit: float = DEFAULT_OVERCOMMIT) -> int:
    """This machine's memory times `overcommit` (the operator's OPENCODE_ENV_MEMORY_OVERCOMMIT)."""
    if overcommit <= 0:
        raise SandboxError(
            f"the memory overcommit factor ({variable('memory_overcommit')}) must be above 0, got {overcommit}"
        )
    return int(machine_memory_mb() * overcommit)


class MemoryAdmission(Reservations):
    """Reservations of memory limits (MiB) against a budget; one that could never fit is refused at once."""

    def __init__(self, budget_mb: int) -> None:
        super().__init__(budget_mb)

    @property
    def budget_mb(self) -> int:
        return self.capacity

    @property
    def reserved_mb(self) -> int:
        return self.reserved

    async def admit(self, memory_mb: int) -> None:
        if memory_mb > self.budget_mb:
            raise SandboxError(
                f"memory_mb: {memory_mb} MiB (with the proxy's) is over this machine's budget of {self.budget_mb} MiB "
                f"(its memory times {variable('memory_overcommit')}); it could never start here"
            )
        await self.reserve(memory_mb)
