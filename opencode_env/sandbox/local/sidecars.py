"""A rollout's sidecars on the local backend: each service a sandbox of its own (its image, its cgroup, its uids)
whose holder joins the rollout's network namespace, as a pod's containers share one: loopback is shared, the egress
proxy there is the rollout's (its policy), and nothing else of the network exists. Started in dependency order,
each waited for as its dependants ask; all closed with the rollout, whatever ended it."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from opencode_env.sandbox.base import Identity, ResourceLimits, SandboxError, SandboxSpec
from opencode_env.wire import CommandResult, LimitHit
from opencode_env.wire.services import HEALTH_WAIT_S, Service, start_order

SERVICE_LOG = "/tmp/service.log"
LAUNCH_S = 30.0
"""How long starting a service's command in the background may take (not the service's own start-up)."""
HEALTH_POLL_S = 1.0
"""A healthcheck runs again after at most this long (its `interval` when shorter), until it passes or its wait ends."""


class SidecarSandbox(Protocol):
    sandbox_id: str

    async def run(
        self,
        cmd: str,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = ...,
        cwd: str = ...,
        keep_background: bool = ...,
        identity: Identity = ...,
    ) -> CommandResult: ...

    async def read_tail(self, path: str, limit: int) -> bytes: ...

    def limits_hit(self) -> list[LimitHit]: ...

    async def close(self) -> None: ...


SidecarFactory = Callable[[SandboxSpec], Awaitable[SidecarSandbox]]
"""Makes a sidecar's sandbox of a spec (the backend joins it to the rollout's network)."""


def sidecar_spec(service: Service, rollout: SandboxSpec) -> SandboxSpec:
    """A service's sandbox: its image and its own limits, the rollout's network policy; no services of its own."""
    limits = ResourceLimits(
        memory_mb=service.memory_mb,
        max_processes=service.max_processes,
        disk_mb=service.disk_mb,
        cpus=rollout.limits.cpus,
    )
    return SandboxSpec(
        task_id=rollout.task_id,
        image=service.image,
        workdir=service.workdir or "/home/user/workdir",
        lifetime_s=rollout.lifetime_s,
        limits=limits,
        network=rollout.network,
    )


def launch_command(service: Service) -> str:
    """The service's argv, in the background with its output in SERVICE_LOG; prints its pid."""
    return f"{shlex.join(service.command)} > {SERVICE_LOG} 2>&1 < /dev/null &\necho $!\n"


class Sidecars:
    """The running sidecars of one rollout, in the order they started."""

    def __init__(self) -> None:
        self._running: list[tuple[Service, SidecarSandbox, int]] = []

    @property
    def sandboxes(self) -> list[SidecarSandbox]:
        return [sandbox for _, sandbox, _ in self._running]

    async def start(self, services: tuple[Service, ...], rollout: SandboxSpec, create: SidecarFactory) -> None:
        """Each service after what it depends on is started, healthy or done as it asks; SandboxError names the
        service that failed, with its output."""
        for service in start_order(services):
            for dependency in service.depends_on:
                if dependency.condition == "service_healthy":
                    await self._healthy(dependency.service)
            if _completes(service, services):
                await self._complete(service, await self._sandbox(service, rollout, create))
            else:
                await self._launch(service, await self._sandbox(service, rollout, create))
        for service in services:
            if service.awaited == "service_healthy":
                await self._healthy(service.name)

    async def _sandbox(self, service: Service, rollout: SandboxSpec, create: SidecarFactory) -> SidecarSandbox:
        try:
            return await create(sidecar_spec(service, rollout))
        except SandboxError as error:
            raise SandboxError(f"service {service.name!r}: its sandbox could not start: {error}") from error

    async def _launch(self, service: Service, sandbox: SidecarSandbox) -> None:
        self._running.append((service, sandbox, 0))
        started = await sandbox.run(
            launch_command(service), timeout_s=LAUNCH_S, env=service.env, cwd=service.workdir or "/",
            keep_background=True, identity="root",
        )  # fmt: skip
        if started.exit_code != 0 or not started.stdout.strip().isdigit():
            raise SandboxError(f"service {service.name!r}: its command did not start: {started.stderr.strip()[-600:]}")
        self._running[-1] = (service, sandbox, int(started.stdout.strip()))

    async def _complete(self, service: Service, sandbox: SidecarSandbox) -> None:
        """A service a dependant waits to finish (`service_completed_successfully`): run to its end, bounded."""
        self._running.append((service, sandbox, 0))
        ran = await sandbox.run(
            shlex.join(service.command),
            timeout_s=HEALTH_WAIT_S,
            env=service.env,
            cwd=service.workdir or "/",
            identity="root",
        )
        if ran.timed_out or ran.exit_code != 0:
            how = f"did not finish in {HEALTH_WAIT_S:.0f} s" if ran.timed_out else f"exited {ran.exit_code}"
            output = (ran.stdout + ran.stderr).strip()[-600:]
            raise SandboxError(f"service {service.name!r} {how} (a dependant waits for it to succeed): {output}")

    async def _healthy(self, name: str) -> None:
        service, sandbox, pid = next(entry for entry in self._running if entry[0].name == name)
        check = service.healthcheck
        assert check is not None
        started, ends = time.monotonic(), time.monotonic() + check.unhealthy_after_s()
        last: CommandResult | None = None
        while last is None or time.monotonic() < ends:
            last = await sandbox.run(
                shlex.join(check.test), timeout_s=min(check.timeout_s, HEALTH_WAIT_S), env=service.env,
                cwd=service.workdir or "/", identity="root",
            )  # fmt: skip
            if last.exit_code == 0 and not last.timed_out:
                return
            if pid and not await _alive(sandbox, pid):
                raise SandboxError(f"service {name!r} exited before its healthcheck passed: {await self._log(sandbox)}")
            await asyncio.sleep(min(check.interval_s, HEALTH_POLL_S))
        said = (last.stdout + last.stderr).strip()[-300:]
        raise SandboxError(
            f"service {name!r}: its healthcheck did not pass within {time.monotonic() - started:.0f} s (last: "
            f"{said!r}); its output: {await self._log(sandbox)}"
        )

    async def _log(self, sandbox: SidecarSandbox) -> str:
        try:
            return (await sandbox.read_tail(SERVICE_LOG, 600)).decode(errors="replace").strip() or "nothing"
        except SandboxError as error:
            return f"unreadable ({error})"

    async def down(self) -> list[str]:
        """The long-running services whose process has exited."""
        return [service.name for service, sandbox, pid in self._running if pid and not await _alive(sandbox, pid)]

    def limits_hit(self) -> list[LimitHit]:
        return [hit for sandbox in self.sandboxes for hit in sandbox.limits_hit()]

    def described(self) -> str:
        return ", ".join(f"{service.name} ({sandbox.sandbox_id})" for service, sandbox, _ in self._running)

    async def close(self) -> None:
        """Every sidecar closed, the last started first; each close runs whatever the one before it did."""
        running, self._running = self._running, []
        await _close_each([sandbox for _, sandbox, _ in reversed(running)])


async def _close_each(sandboxes: list[SidecarSandbox]) -> None:
    if not sandboxes:
        return
    try:
        await sandboxes[0].close()
    finally:
        await _close_each(sandboxes[1:])


async def _alive(sandbox: SidecarSandbox, pid: int) -> bool:
    """Whether the service's process is there (looked up in the sandbox's own PID namespace, where it started)."""
    found = await sandbox.run(f"kill -0 {pid}", timeout_s=LAUNCH_S, keep_background=True, identity="root")
    return found.exit_code == 0


def _completes(service: Service, services: tuple[Service, ...]) -> bool:
    """Whether a dependant waits for `service` to finish successfully (it then runs in the foreground)."""
    wanted = "service_completed_successfully"
    return service.awaited == wanted or any(
        d.service == service.name and d.condition == wanted for other in services for d in other.depends_on
    )
