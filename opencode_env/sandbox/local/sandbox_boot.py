"""Starting a local sandbox: its cgroups (the sandbox's and its capture proxy's), its namespace holder (see
isolation.py), and its network: the egress proxy and the relays to model endpoints on the host's loopback, listening
inside the sandbox's own network namespace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path

from opencode_env.sandbox.base import ProvidedTools, SandboxError, SandboxSpec
from opencode_env.sandbox.local import netns
from opencode_env.sandbox.local.cgroup import PROXY_LIMITS, Cgroup, Limits, cgroup_prefix, detect, proxy_cgroup_name
from opencode_env.sandbox.local.egress import LOOPBACK_NAMES, EgressPolicy, EgressProxy, LoopbackRelay
from opencode_env.sandbox.local.host_runtime import BASE_PATH, HostRuntime
from opencode_env.sandbox.local.host_view import sandbox_runtime_paths
from opencode_env.sandbox.local.images import PreparedImage
from opencode_env.sandbox.local.isolation import Layout, holder_argv

HOLDER_START_S = 10.0
EGRESS_PORT = 3128


class SandboxBoot:
    """LocalSandbox's start (a part of LocalSandbox, which sets these attributes)."""

    layout: Layout
    image: PreparedImage | None
    tools: ProvidedTools
    sandbox_id: str
    enforcement: dict[str, str]
    _host_tools: ProvidedTools
    _runtime: HostRuntime
    _spec: SandboxSpec
    _extra_path: tuple[str, ...]
    _share_host_network: bool
    _trusted_hosts: frozenset[str]
    _holder: asyncio.subprocess.Process | None
    _holder_pid: int
    _cgroup: Cgroup | None
    _proxy_cgroup: Cgroup | None
    _egress: EgressProxy | None
    _relays: list[LoopbackRelay]

    async def boot(self) -> None:
        """Start the namespace holder, inside the rollout's cgroup, and its egress proxy."""
        limits = self._spec.limits
        version = detect()
        if version is not None:
            self._cgroup = Cgroup(self.layout.root.name, version)
            await asyncio.to_thread(
                self._cgroup.create, Limits(limits.memory_mb * 2**20, limits.max_processes, limits.cpus)
            )
            self._proxy_cgroup = Cgroup(proxy_cgroup_name(self.layout.root.name), version)
            await asyncio.to_thread(self._proxy_cgroup.create, PROXY_LIMITS)
            self.enforcement["limits"] = f"cgroup {version}"
        else:
            self.enforcement["limits"] = "none (no writable cgroup)"
        argv = [
            *cgroup_prefix(self._cgroup),
            *holder_argv(
                self.layout,
                sandbox_runtime_paths(self._host_tools, self._extra_path),
                share_host_network=self._share_host_network,
                config_deps=self.tools.opencode_config_deps,
                image_root=self.layout.image_root if self.image is not None else None,
                runtime=self._runtime,
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
        try:
            line = await asyncio.wait_for(self._holder.stdout.readline(), HOLDER_START_S)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            assert self._holder.stderr is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._holder.pid, signal.SIGKILL)
            stderr = (await self._holder.stderr.read(4096)).decode(errors="replace").strip()
            raise SandboxError(f"the sandbox could not start: {stderr or 'no message from bubblewrap'}")
        self._holder_pid = _sandbox_init_pid(self._holder.pid)
        if self._share_host_network:
            self.enforcement["network"] = "the host's (share_host_network)"
            return
        self._egress = EgressProxy(
            EgressPolicy(
                internet=self._spec.network == "internet",
                allowed=frozenset(self._spec.model_endpoints),
                trusted_hosts=self._trusted_hosts,
            ),
            rollout=self.sandbox_id,
        )
        await self._egress.serve(netns.listen_in(self._holder_pid, EGRESS_PORT))
        for host, port in self._spec.model_endpoints:
            if host in LOOPBACK_NAMES:
                relay = LoopbackRelay(port, self.sandbox_id)
                await relay.serve(netns.listen_in(self._holder_pid, port))
                self._relays.append(relay)
        self.enforcement["network"] = f"own namespace, egress {self._spec.network}"


def _sandbox_init_pid(bwrap_pid: int) -> int:
    """The pid (as the host sees it) of pid 1 of the holder's namespaces: bubblewrap's only child."""
    children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    if not children:
        raise SandboxError("the sandbox's holder has no init process")
    return int(children[0])
