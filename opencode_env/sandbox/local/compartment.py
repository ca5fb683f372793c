"""What one local sandbox is made of, fixed when the backend creates it: the one typed object its boot, processes and
files parts (sandbox_boot.py, sandbox_processes.py, sandbox_files.py) all read."""

from __future__ import annotations

from dataclasses import dataclass

from opencode_env.sandbox.base import ProvidedTools, SandboxSpec
from opencode_env.sandbox.local.host_ids import HostIds
from opencode_env.sandbox.local.host_runtime import HOST_ROOT, HostRuntime
from opencode_env.sandbox.local.images import PreparedImage
from opencode_env.sandbox.local.isolation import Layout


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
    share_host_network: bool = False
    trusted_hosts: frozenset[str] = frozenset()

    @property
    def sandbox_id(self) -> str:
        return f"local-{self.layout.root.name}"
