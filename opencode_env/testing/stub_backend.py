"""A sandbox backend that runs nothing: commands sleep and succeed, files live in memory.

Only for measuring and stressing the server and the pipeline around the agent (load tests, hostile-input tests),
where a real OpenCode run would be the thing measured instead.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    OPENCODE_DATA_DIR,
    REWARD_FILES,
    WORKDIR,
    Capabilities,
    CarryLimits,
    CarryReport,
    FileEntry,
    Identity,
    Preflight,
    ProvidedTools,
    ProxyLaunch,
    SandboxBackend,
    SandboxSpec,
    per_cpu_concurrency,
)
from opencode_env.wire import CommandResult, LimitHit


class StubProcess:
    async def running(self) -> bool:
        return False

    async def kill(self) -> None:
        return None


class StubProxy:
    """A proxy that is healthy and records nothing."""

    base_url = "http://127.0.0.1:9/v1"
    token = "stub"
    status_interval_s = 1.0

    async def running(self) -> bool:
        return True

    async def kill(self) -> None:
        return None

    async def call(self, path: str, method: str, wait_s: float) -> dict[str, Any] | None:
        return {"ok": True, "turns_written": 0}

    async def read(self, name: str, limit: int) -> bytes:
        return b""


class MemoryFiles:
    """The file half of the Sandbox protocol for doubles that run nothing: files live in `files`, and each call
    first waits `pause("file")` (no time here; the latency bench's sandbox waits as a real one would)."""

    files: dict[str, bytes]

    async def pause(self, kind: str) -> None:
        return None

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self.pause("file")
        self.files[path] = data.encode() if isinstance(data, str) else data

    async def read_file(self, path: str) -> bytes:
        await self.pause("file")
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    async def write_control_file(self, name: str, data: str) -> str:
        await self.write_file(f"/control/{name}", data)
        return f"/control/{name}"

    async def read_tail(self, path: str, limit: int) -> bytes:
        return (await self.read_file(path))[-limit:]

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        await self.pause("file")
        self.files.update(dict.fromkeys(REWARD_FILES, b""))
        for path, text in protected.items():
            self.files[f"{WORKDIR}/{path}"] = text.encode()

    async def carry_workdir_to(self, target: Any, *, keep: tuple[str, ...], limits: CarryLimits) -> CarryReport:
        """The work dir's files into `target`'s (another double's), replacing what it held there."""
        await self.pause("file")
        prefix = f"{WORKDIR}/"
        carried = {path: data for path, data in self.files.items() if path.startswith(prefix)}
        kept = {path: data for path, data in target.files.items() if not path.startswith(prefix)}
        target.files = kept | carried
        return CarryReport(files=len(carried), bytes=sum(len(data) for data in carried.values()))

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        await self.pause("file")
        prefix = root.rstrip("/") + "/"
        inside = [(path, data) for path, data in self.files.items() if path.startswith(prefix)]
        return [FileEntry(path.removeprefix(prefix), len(data)) for path, data in inside][:limit]


class StubSandbox(MemoryFiles):
    backend = "stub"
    enforcement: dict[str, str] = {}  # noqa: RUF012 - read-only, shared by every stub
    opencode_data_dir = OPENCODE_DATA_DIR
    opencode_isolated = False

    def __init__(self, sandbox_id: str, command_s: float, registry: set[str]) -> None:
        self.sandbox_id = sandbox_id
        self.tools = ProvidedTools(opencode="opencode", opencode_version="stub", python="python3", proxy_ready=True)
        self._command_s = command_s
        self.files: dict[str, bytes] = {}
        self._registry = registry

    async def run(
        self,
        cmd: str,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKDIR,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        keep_background: bool = False,
        identity: Identity = "user",
    ) -> CommandResult:
        await asyncio.sleep(min(self._command_s, timeout_s))
        return CommandResult(cmd=cmd, exit_code=0, duration_s=self._command_s)

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> StubProcess:
        return StubProcess()

    async def start_proxy(self, launch: ProxyLaunch) -> StubProxy:
        return StubProxy()

    async def pause_services(self) -> bool:
        return False

    async def resume_services(self) -> None:
        return None

    def limits_hit(self) -> list[LimitHit]:
        return []

    async def services_down(self) -> list[str]:
        return []

    async def close(self) -> None:
        self._registry.discard(self.sandbox_id)


class StubBackend:
    """Sandboxes that run nothing: every command exits 0 after `command_s`. It enforces no limit, and runs no proxy
    a task's root could reach (its proxy is a stand-in); it has nothing to check before a rollout. `capabilities`
    makes it stand in for a backend that declares others (a cloud VM's `proxy_beside_task_root`, say), for testing
    what the pipeline does with them."""

    name = "stub"
    capabilities = Capabilities(
        enforces_limits=False, proxy_beside_task_root=False, default_concurrency=per_cpu_concurrency()
    )

    def __init__(
        self, *, create_s: float = 0.0, command_s: float = 0.0, capabilities: Capabilities | None = None
    ) -> None:
        if capabilities is not None:
            self.capabilities = capabilities
        self._create_s = create_s
        self._command_s = command_s
        self._ids = itertools.count(1)
        self.alive: set[str] = set()

    async def close_all(self) -> int:
        count = len(self.alive)
        self.alive.clear()
        return count

    async def preflight(self) -> Preflight:
        return self.preflight_verdict()

    def preflight_verdict(self) -> Preflight:
        return Preflight()

    async def create(self, spec: SandboxSpec) -> StubSandbox:
        await asyncio.sleep(self._create_s)
        sandbox = StubSandbox(f"stub{next(self._ids)}", self._command_s, self.alive)
        self.alive.add(sandbox.sandbox_id)
        return sandbox


def as_backend(stub: StubBackend) -> SandboxBackend:
    """The stub seen through the seam it stands in for (mypy checks that it still fits the Protocol)."""
    return stub
