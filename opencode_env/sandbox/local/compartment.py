"""What one local sandbox is made of, fixed when the backend creates it: the one typed object its boot, processes and
files parts (sandbox_boot.py, sandbox_processes.py, sandbox_files.py) all read."""

from __future__ import annotations

from dataclasses import dataclass

from opencode_env.sandbox.base import ProvidedTools, SandboxSpec
from opencode_env.sandbox.local.images.store import PreparedImage
from opencode_env.sandbox.local.isolation.bubblewrap import Layout
from opencode_env.sandbox.local.isolation.host_ids import HostIds
from opencode_env.sandbox.local.isolation.host_runtime import HOST_ROOT, HostRuntime


@dataclass(frozen=True)
class Compartment:
    """`tools` as the sandbox starts them and `host_tools` as the host has them (the same now: OpenCode runs from
    the host's files in the sandbox's root, an image or not); `image` None runs the task's commands on the host's own
    system, else in the image's tree, starting the host's bash through `runtime`."""

    layout: Layout
    ids: HostIds
    spec: SandboxSpec
    tools: ProvidedTools
    host_tools: ProvidedTools
    image: PreparedImage | None = None
    runtime: HostRuntime = HOST_ROOT
    extra_path: tuple[str, ...] = ()
    """Host directories put on PATH, as the sandbox shows them (at RUNTIME_MOUNT + their host paths)."""
    sandbox_path: tuple[str, ...] = ()
    """Directories of the sandbox's own put on PATH first, as they are (an emulated cloud VM's npm prefix)."""
    share_host_network: bool = False
    trusted_hosts: frozenset[str] = frozenset()
    network_of: int = 0
    """A sidecar's: the host pid of the rollout's holder, whose network namespace it joins (0: a network of its
    own)."""
    local_names: tuple[str, ...] = ()
    """Names its /etc/hosts gives 127.0.0.1 (the rollout's services) and its egress proxy is not asked for."""

    @property
    def sandbox_id(self) -> str:
        return f"local-{self.layout.root.name}"
