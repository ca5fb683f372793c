"""The lifecycle every cloud backend (E2B, Hugging Face) shares, from the request for a VM to its end.

A slot is taken from admission before a VM is asked for (creations staggered) and given back when its sandbox
closes or its creation fails; every VM is tagged, so that `reap` finds the ones that outlived their rollout; a
creation the rollout stops waiting for (cancelled, or past the provider's start timeout) goes on, and its VM is
killed as soon as it exists; a VM whose preparation fails, or is cancelled, is killed; the open sandboxes are kept
for `close_all`. What each cloud does its own way (its SDK's calls and errors) is a `Provider`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from opencode_env.sandbox.base import OpenSandboxes, ProvidedTools, Sandbox, SandboxError, SandboxSpec
from opencode_env.sandbox.cloud.admission import Admission

log = logging.getLogger("opencode_env.cloud")
CREATE_STAGGER_S = 0.25
LIFETIME_MARGIN_S = 300
"""How long a VM may outlive its rollout's own lifetime before the provider ends it."""
START_GRACE_S = 30.0
"""How long past its own start timeout the provider's SDK may take to say that a VM did not start."""
S_co = TypeVar("S_co", bound=Sandbox, covariant=True)


@dataclass(frozen=True)
class Tags:
    """How one provider names a VM's tags: `marker` is what `reap` lists VMs by; the others say whose it was."""

    marker: str
    server: str
    task: str
    created: str
    clean: Callable[[str], str]
    """A value as the provider accepts it (its length, its characters)."""

    def of(self, server_id: str, task_id: str) -> dict[str, str]:
        return {
            self.marker: "1",
            self.server: self.clean(server_id),
            self.task: self.clean(task_id),
            self.created: str(int(time.time())),
        }


class Provider(Protocol[S_co]):
    """What one cloud's SDK does its own way; `Lifecycle` does the rest."""

    label: str
    """The cloud's name in messages: "E2B", "HF"."""
    cap_setting: str
    """The setting that caps its VMs alive at once (its variable's name), for the message that says to raise it."""
    tags: Tags
    start_timeout_s: float | None
    """How long a VM may take to start before its rollout stops waiting (None: as long as the SDK takes)."""

    def credential(self) -> str:
        """The key new VMs are created with; SandboxError when there is none."""
        ...

    async def create_vm(self, image: str, spec: SandboxSpec, tags: Mapping[str, str], credential: str) -> Any:
        """A new VM running `image`, with `tags`, ended by the provider LIFETIME_MARGIN_S after spec.lifetime_s."""
        ...

    def create_error(self, error: Exception, image: str) -> SandboxError:
        """The SDK's failure to create a VM as one message that says what to do."""
        ...

    def vm_id(self, vm: Any) -> str: ...

    async def kill_vm(self, vm: Any) -> None:
        """Kill the VM; SandboxError when the provider does not."""
        ...

    async def prepare(self, vm: Any, spec: SandboxSpec, image: str) -> ProvidedTools:
        """Make a new VM ready for a rollout; what it provides."""
        ...

    def open_sandbox(self, vm: Any, tools: ProvidedTools, spec: SandboxSpec, release: Callable[[], None]) -> S_co:
        """The sandbox on a prepared VM; it calls `release` once closed."""
        ...


async def kill_quietly(label: str, vm_id: str, kill: Awaitable[None]) -> None:
    """A VM that could not be killed is logged rather than raised: its rollout is over either way, and the VM's
    tags let `opencode-env reap` find it."""
    try:
        await kill
    except SandboxError as error:
        log.error("killing %s sandbox %s failed: %s (opencode-env reap will find it)", label, vm_id, error)


OPENCODE_VERSION_PROBE = (
    'bin="$(command -v opencode)" && manifest="$(dirname "$(readlink -f "$bin")")/../package.json"'
    ' && python3 -I -c "import json, sys; package = json.load(open(sys.argv[1]));'
    " assert package['name'].startswith('opencode'); print(package['version'])\" \"$manifest\" 2>/dev/null"
    " || opencode --version 2>/dev/null | tail -n 1"
)
"""The version of the OpenCode on the PATH, as npm installed it: the manifest of the package its binary belongs to (the
npm package `opencode-ai`, or the per-platform package our install step unpacks), read the way `npm ls` reads it.
OpenCode itself is asked only where no such manifest is found: `opencode --version` boots the whole agent, 1.8-2 s of
CPU before it prints a line (measured on OpenCode 1.18), which every new VM's probe paid before its rollout began."""


def provided_tools(opencode_version: str | None, proxy_ready: bool) -> ProvidedTools:
    """What a new VM's probe found: OpenCode on the PATH (its version), and whether python3 has the proxy's
    packages; the pipeline installs what is missing."""
    return ProvidedTools(
        opencode="opencode" if opencode_version else None,
        opencode_version=opencode_version,
        python="python3",
        proxy_ready=proxy_ready,
    )


class Lifecycle(Generic[S_co]):
    """A cloud backend's sandboxes, at most `limit` alive at once."""

    def __init__(self, provider: Provider[S_co], *, limit: int, server_id: str = "") -> None:
        self._provider = provider
        self._admission = Admission(limit, stagger_s=CREATE_STAGGER_S)
        self._server_id = server_id or f"{os.uname().nodename}-{os.getpid()}"
        self._open = OpenSandboxes()
        self._late_kills: set[asyncio.Future[None]] = set()

    async def create(self, spec: SandboxSpec, image: str) -> S_co:
        """A prepared sandbox on a new VM running `image`; it holds its slot until it closes."""
        if spec.services:
            raise SandboxError(
                f"services: a {self._provider.label} sandbox is one VM per rollout, without sidecars (run the "
                "services inside the main image, started by its ENTRYPOINT, or use the local backend)"
            )
        credential = self._provider.credential()
        role = spec.grader_box
        if role == "planned" and self._admission.limit < 2:
            raise SandboxError(
                f"{self._provider.cap_setting}={self._admission.limit} holds fewer {self._provider.label} sandboxes "
                "than a rollout graded in the grader's box needs (2: the agent's VM and, for verify, the grader's): "
                "raise it to 2 or more, or ask for verify_sandbox='same'"
            )
        await self._admission.acquire(role)
        try:
            vm = await self._create_killing_if_late(spec, image, credential)
            try:
                tools = await self._provider.prepare(vm, spec, image)
            except BaseException:
                # A VM that exists bills until its lifetime ends: kill it whatever stopped its preparation.
                await asyncio.shield(self._kill_quietly(vm))
                raise
        except BaseException:
            self._admission.release(role)
            raise
        opened: S_co

        def release() -> None:
            self._admission.release(role)
            self._open.discard(opened)

        opened = self._provider.open_sandbox(vm, tools, spec, release)
        self._open.add(opened)
        return opened

    async def close_all(self) -> int:
        return await self._open.close_all()

    async def _create_killing_if_late(self, spec: SandboxSpec, image: str, credential: str) -> Any:
        tags = self._provider.tags.of(self._server_id, spec.task_id)
        creating = asyncio.ensure_future(self._provider.create_vm(image, spec, tags, credential))
        start_timeout = self._provider.start_timeout_s
        try:
            await asyncio.wait({creating}, timeout=None if start_timeout is None else start_timeout + START_GRACE_S)
        except asyncio.CancelledError:
            creating.add_done_callback(self._kill_when_created)
            raise
        if not creating.done():
            creating.add_done_callback(self._kill_when_created)
            raise SandboxError(
                f"the {self._provider.label} sandbox (image {image!r}) was not ready within {start_timeout:.0f} s"
            )
        try:
            return creating.result()
        except Exception as error:
            raise self._provider.create_error(error, image) from error

    def _kill_when_created(self, creating: asyncio.Future[Any]) -> None:
        # A creation that failed after its rollout stopped waiting has nothing to kill; its error has no one to tell.
        if creating.cancelled() or creating.exception() is not None:
            return
        vm = creating.result()
        log.warning(
            "creation of %s sandbox %s finished after its rollout stopped waiting: killing it",
            self._provider.label,
            self._provider.vm_id(vm),
        )
        kill = asyncio.ensure_future(self._kill_quietly(vm))
        self._late_kills.add(kill)
        kill.add_done_callback(self._late_kills.discard)

    async def _kill_quietly(self, vm: Any) -> None:
        await kill_quietly(self._provider.label, self._provider.vm_id(vm), self._provider.kill_vm(vm))
