"""Starting a local sandbox and taking it down: its cgroups (the sandbox's and its capture proxy's), its namespace
holder (see isolation/bubblewrap.py), and its network: the egress proxy and the relays to model endpoints on the host's
loopback, listening inside the sandbox's own network namespace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path

from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.local.compartment import Compartment
from opencode_env.sandbox.local.isolation import netns
from opencode_env.sandbox.local.isolation.bubblewrap import holder_argv
from opencode_env.sandbox.local.isolation.cgroup import (
    PROXY_LIMITS,
    Cgroup,
    Limits,
    ServicesFreezer,
    cgroup_prefix,
    detect,
    proxy_cgroup_name,
)
from opencode_env.sandbox.local.isolation.egress import LOOPBACK_NAMES, EgressPolicy, EgressProxy, LoopbackRelay
from opencode_env.sandbox.local.isolation.host_runtime import BASE_PATH
from opencode_env.sandbox.local.isolation.host_view import sandbox_runtime_paths
from opencode_env.wire import LimitHit

HOLDER_START_S = 120.0
"""How long the sandbox's holder (bubblewrap and our init) may take to say it is ready. One that fails says so at
once (its stdout closes), so this bounds only a slow start: at load ~15 on two cores the 10 s it was turned healthy
sandboxes into `sandbox_error`s. The sandbox phase's share of a rollout's deadline is 120 s (SANDBOX_MARGIN_S)."""
EGRESS_PORT = 3128


class SandboxBoot:
    """Starts a sandbox's compartment and takes it down: owns its cgroups, its namespace holder and its network
    (egress proxy, loopback relays)."""

    def __init__(self, compartment: Compartment) -> None:
        self._compartment = compartment
        self._holder: asyncio.subprocess.Process | None = None
        self._holder_pid = 0
        self._cgroup: Cgroup | None = None
        self._proxy_cgroup: Cgroup | None = None
        self._services: ServicesFreezer | None = None
        self._egress: EgressProxy | None = None
        self._relays: list[LoopbackRelay] = []

    @property
    def holder_pid(self) -> int:
        """The host's pid of the sandbox's pid 1, whose namespaces every command enters (0 before the start)."""
        return self._holder_pid

    @property
    def cgroup(self) -> Cgroup | None:
        return self._cgroup

    @property
    def proxy_cgroup(self) -> Cgroup | None:
        return self._proxy_cgroup

    @property
    def services(self) -> ServicesFreezer | None:
        """The freezable cgroup setup's services start in; None without a writable cgroup freezer."""
        return self._services

    def services_prefix(self) -> list[str]:
        """The argv prefix of a command whose background processes live on (setup's): the rollout's cgroup, then
        the services' freezer."""
        if self._cgroup is None:
            return []
        also = [self._services.procs_file()] if self._services is not None else []
        return self._cgroup.join_prefix(*also)

    async def start(self) -> dict[str, str]:
        """Start the namespace holder, inside the rollout's cgroup, and its egress proxy; returns what was enforced
        (the sandbox's `enforcement` entries "limits" and "network")."""
        compartment = self._compartment
        layout, spec = compartment.layout, compartment.spec
        enforcement: dict[str, str] = {}
        version = detect()
        if version is not None:
            self._cgroup = Cgroup(layout.root.name, version)
            await asyncio.to_thread(
                self._cgroup.create,
                Limits(spec.limits.memory_mb * 2**20, spec.limits.max_processes, spec.limits.cpus),
            )
            self._proxy_cgroup = Cgroup(proxy_cgroup_name(layout.root.name), version)
            await asyncio.to_thread(self._proxy_cgroup.create, PROXY_LIMITS)
            if ServicesFreezer.available(version):
                self._services = ServicesFreezer(layout.root.name, version)
                await asyncio.to_thread(self._services.create)
            enforcement["limits"] = f"cgroup {version}"
        else:
            enforcement["limits"] = "none (no writable cgroup)"
        joined = compartment.network_of
        argv = [
            *cgroup_prefix(self._cgroup),
            *(["nsenter", f"--net=/proc/{joined}/ns/net", "--"] if joined else []),
            *holder_argv(
                layout,
                sandbox_runtime_paths(compartment.host_tools, compartment.extra_path),
                share_host_network=compartment.share_host_network or bool(joined),
                config_deps=compartment.host_tools.opencode_config_deps,
                image_root=layout.image_root if compartment.image is not None else None,
                runtime=compartment.runtime,
            ),
        ]
        self._holder = await asyncio.create_subprocess_exec(
            *argv,
            env={"PATH": BASE_PATH},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._holder.stdout is not None
        timed_out = False
        try:
            line = await asyncio.wait_for(self._holder.stdout.readline(), HOLDER_START_S)
        except TimeoutError:
            line, timed_out = b"", True
        if line.strip() != b"ready":
            assert self._holder.stderr is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._holder.pid, signal.SIGKILL)
            stderr = (await self._holder.stderr.read(4096)).decode(errors="replace").strip()
            if timed_out:
                raise SandboxError(f"the sandbox did not start within {HOLDER_START_S:.0f} s: {stderr or 'no message'}")
            raise SandboxError(f"the sandbox could not start: {stderr or 'no message from bubblewrap'}")
        self._holder_pid = _sandbox_init_pid(self._holder.pid)
        if compartment.share_host_network:
            enforcement["network"] = "the host's (share_host_network)"
            return enforcement
        if joined:
            enforcement["network"] = "the rollout's (a sidecar in its namespace: its egress policy)"
            return enforcement
        await self._start_network()
        enforcement["network"] = f"own namespace, egress {spec.network}"
        return enforcement

    async def _start_network(self) -> None:
        compartment = self._compartment
        spec = compartment.spec
        self._egress = EgressProxy(
            EgressPolicy(
                internet=spec.network == "internet",
                allowed=frozenset(spec.model_endpoints),
                trusted_hosts=compartment.trusted_hosts,
            ),
            rollout=compartment.sandbox_id,
        )
        await self._egress.serve(netns.listen_in(self._holder_pid, EGRESS_PORT))
        for host, port in spec.model_endpoints:
            if host in LOOPBACK_NAMES:
                relay = LoopbackRelay(port, compartment.sandbox_id)
                await relay.serve(netns.listen_in(self._holder_pid, port))
                self._relays.append(relay)

    def limits_hit(self) -> list[LimitHit]:
        return self._cgroup.limits_hit() if self._cgroup is not None else []

    def egress_attempts(self) -> list[str]:
        if self._egress is None:
            return []
        return [
            f"{a.host}:{a.port} {'allowed' if a.allowed else 'refused'} ({a.reason})" for a in self._egress.attempts
        ]

    async def stop(self) -> None:
        """Network, holder, cgroups: each step runs whatever the one before it did."""
        try:
            if self._egress is not None:
                await self._egress.close()
            for relay in self._relays:
                await relay.close()
        finally:
            try:
                await self._stop_holder()
            finally:
                if self._services is not None:
                    await asyncio.to_thread(self._services.destroy)
                for cgroup in (self._cgroup, self._proxy_cgroup):
                    if cgroup is not None:
                        await asyncio.to_thread(cgroup.destroy)

    async def _stop_holder(self) -> None:
        if self._holder is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._holder.pid, signal.SIGKILL)
        await self._holder.wait()


def _sandbox_init_pid(bwrap_pid: int) -> int:
    """The pid (as the host sees it) of pid 1 of the holder's namespaces: bubblewrap's only child."""
    children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    if not children:
        raise SandboxError("the sandbox's holder has no init process")
    return int(children[0])
