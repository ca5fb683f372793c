"""The embedded local backend: one isolated compartment per rollout on this machine (see isolation/bubblewrap.py).

What holds, proven by tests/integration/test_hostile.py: sandbox processes run as `user` (uid 1000) mapped to an
unprivileged host uid of their own, with no capability over any host resource; they see the host read-only and
only their own writable tree; they have their own network namespace (loopback, plus an egress proxy that refuses
private addresses; unless the backend shares the host's network, see LocalBackend); the capture proxy and its key
live outside their namespaces; memory, processes, CPU and disk are limited per rollout; the server reads and writes
their tree without following a single symlink.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    WORKDIR,
    Capabilities,
    CarryLimits,
    CarryReport,
    CloseOnce,
    FileEntry,
    Identity,
    OpenSandboxes,
    Preflight,
    ProvidedTools,
    ProxyLaunch,
    ResourceLimits,
    RolloutSandbox,
    SandboxError,
    SandboxSpec,
    per_cpu_concurrency,
)
from opencode_env.sandbox.local.admission import DEFAULT_OVERCOMMIT, MemoryAdmission, memory_budget_mb
from opencode_env.sandbox.local.compartment import Compartment
from opencode_env.sandbox.local.images.budget import ImageBudget
from opencode_env.sandbox.local.images.store import HOST_IMAGE, HeldImage, ImageProgress, ImageStore, default_image
from opencode_env.sandbox.local.isolation.bubblewrap import AGENT_ONLY_ENV, CONTROL_MOUNT, HOSTS
from opencode_env.sandbox.local.isolation.cgroup import PROXY_LIMITS
from opencode_env.sandbox.local.isolation.host_runtime import HOST_ROOT
from opencode_env.sandbox.local.isolation.host_view import HELPERS, runtime_for, sandbox_tools
from opencode_env.sandbox.local.layout import (
    RolloutTree,
    make_tree,
    reap_orphans,
)
from opencode_env.sandbox.local.proxy import LocalProxy
from opencode_env.sandbox.local.sandbox_boot import SandboxBoot
from opencode_env.sandbox.local.sandbox_files import SandboxFiles
from opencode_env.sandbox.local.sandbox_processes import LocalProcess, SandboxProcesses
from opencode_env.sandbox.local.sidecars import Sidecars
from opencode_env.sandbox.local.tools import cache_root
from opencode_env.settings import DEFAULT_IMAGE_STORAGE_MB
from opencode_env.wire import CommandResult, LimitHit
from opencode_env.wire.services import hosts_names
from opencode_env.wire.task_paths import OutsideTaskRoots, confined_dir

log = logging.getLogger("opencode_env.local")
DISK_FULL_BYTES = 2**20
"""Less than this left to the sandbox's uids counts as a full disk (ext4 refuses a write before the last block)."""
INSTALL_HINT = (
    "bubblewrap (bwrap) is not installed; the local backend needs it to isolate rollouts. "
    "Install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`."
)
ROOT_HINT = (
    "the local backend isolates each rollout with its own unprivileged host uid, namespaces and cgroup, which "
    "needs the server to run as root (as in a container or CI); run it as root, or use the E2B or Hugging Face "
    "backend"
)

PREFLIGHT_S = 30.0
PREFLIGHT_DISK_MB = 64
PREFLIGHT_HINT = (
    "The local backend cannot isolate rollouts on this machine (a container with Docker's default seccomp profile "
    "or a Hugging Face Space cannot create the namespaces, uids and mounts it needs): run rollouts elsewhere by "
    "setting E2B_API_KEY, or HF_TOKEN with OPENCODE_ENV_HF_SANDBOXES=1"
)

ToolsResolver = Callable[[], Awaitable[ProvidedTools]]


class LocalSandbox:
    """One rollout's compartment, made of three parts it holds and delegates to, each owning its state: its boot
    (cgroups, namespace holder, network: sandbox_boot.py), its processes (sandbox_processes.py) and its files
    (sandbox_files.py); all three read the same `Compartment`. It releases them, and its uids and tree, on close."""

    backend = "local"

    def __init__(
        self,
        compartment: Compartment,
        *,
        tree: RolloutTree,
        image_hold: HeldImage | None = None,
    ) -> None:
        self.compartment = compartment
        self.layout = compartment.layout
        self.root = compartment.layout.root
        self.image = compartment.image
        self.tools = compartment.tools
        self.sandbox_id = compartment.sandbox_id
        self.control_dir = CONTROL_MOUNT
        self.enforcement: dict[str, str] = {}
        self.opencode_data_dir = AGENT_ONLY_ENV["XDG_DATA_HOME"]
        self.opencode_isolated = True
        self.on_close: Callable[[LocalSandbox], None] | None = None
        self._tree = tree
        self._image_hold = image_hold
        self.sidecars = Sidecars()
        self._boot = SandboxBoot(compartment)
        self._processes = SandboxProcesses(compartment, self._boot)
        self._files = SandboxFiles(compartment)
        self._closer = CloseOnce(self._close)

    @property
    def owner(self) -> tuple[int, int]:
        return self.compartment.ids.user, self.compartment.ids.user

    async def boot(self) -> None:
        self.enforcement.update(await self._boot.start())

    def _refuse_if_closed(self) -> None:
        if self._closer.started:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")

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
        self._refuse_if_closed()
        return await self._processes.run(
            cmd,
            timeout_s=timeout_s,
            env=env,
            cwd=cwd,
            max_output_bytes=max_output_bytes,
            keep_background=keep_background,
            identity=identity,
        )

    async def spawn(
        self,
        cmd: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKDIR,
        identity: Identity = "user",
        own_pid_namespace: bool = True,
    ) -> LocalProcess:
        self._refuse_if_closed()
        return await self._processes.spawn(
            cmd, env=env, cwd=cwd, identity=identity, own_pid_namespace=own_pid_namespace
        )

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> LocalProcess:
        self._refuse_if_closed()
        return await self._processes.start(cmd, log_path=log_path, env=env, cwd=cwd)

    async def pause_services(self) -> bool:
        self._refuse_if_closed()
        return await self._processes.pause_services()

    async def resume_services(self) -> None:
        await self._processes.resume_services()

    async def start_proxy(self, launch: ProxyLaunch) -> LocalProxy:
        return await self._processes.start_proxy(launch)

    async def write_file(self, path: str, data: str | bytes, *, identity: Identity = "user") -> None:
        await self._files.write_file(path, data, identity=identity)

    async def write_machine_file(self, path: str, data: str | bytes, *, identity: Identity = "user") -> None:
        """For the cloud fakes, whose VMs are local sandboxes (SandboxFiles.write_machine_file)."""
        await self._files.write_machine_file(path, data, identity=identity)

    async def write_control_file(self, name: str, data: str) -> str:
        return await self._files.write_control_file(name, data)

    async def read_file(self, path: str) -> bytes:
        return await self._files.read_file(path)

    async def read_tail(self, path: str, limit: int) -> bytes:
        return await self._files.read_tail(path, limit)

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        return await self._files.list_files(root, limit=limit)

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        await self._files.hand_to_grader(protected)

    async def carry_workdir_to(
        self, target: RolloutSandbox, *, keep: tuple[str, ...], limits: CarryLimits
    ) -> CarryReport:
        if not isinstance(target, LocalSandbox):
            raise SandboxError(f"a local sandbox's work dir goes to another local sandbox, not a {target.backend} one")
        target._refuse_if_closed()
        return await self._files.carry_workdir_to(target._files, keep=keep, limits=limits)

    @property
    def holder_pid(self) -> int:
        return self._boot.holder_pid

    def limits_hit(self) -> list[LimitHit]:
        """The cgroup's record of what it enforced, and `disk` when the rollout's own file system is full now (the
        kernel keeps no count of refused writes; the 1% kept for the host does not count)."""
        hit = self._boot.limits_hit() + self.sidecars.limits_hit()
        if self.layout.disk_image.exists():
            free = os.statvfs(self.layout.fs)
            if free.f_bavail * free.f_frsize < DISK_FULL_BYTES:
                hit.append("disk")
        return hit

    async def services_down(self) -> list[str]:
        self._refuse_if_closed()
        return await self.sidecars.down()

    def egress_attempts(self) -> list[str]:
        return self._boot.egress_attempts()

    async def close(self) -> None:
        await self._closer()

    async def _close(self) -> None:
        """Each step runs whatever the one before it did: a sandbox is never left half-released."""
        try:
            await self.sidecars.close()
        finally:
            await self._release()

    async def _release(self) -> None:
        try:
            await self._processes.kill_all()
        finally:
            try:
                await self._boot.stop()
            finally:
                try:
                    await asyncio.to_thread(self._tree.remove)
                finally:
                    if self._image_hold is not None:
                        self._image_hold.release()
                    if self.on_close is not None:
                        self.on_close(self)


AIMED_AT_US = (
    "OPENCODE_",
    "NODE_",
    "BUN_",
    "LD_",
    "GCONV_PATH",
    "LOCPATH",
    "XDG_",
    "SSL_CERT",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
)
"""Names in an image's ENV that would configure OpenCode, Bun or the dynamic loader if they reached them."""


def image_env_aimed_at_us(env: Mapping[str, str]) -> list[str]:
    """The image's ENV names that would have changed a trusted process: the result records them (a finding)."""
    return sorted(name for name in env if name.startswith(AIMED_AT_US))


def _refuse_workdir_of_ours(workdir: str) -> None:
    """The work dir is one of the task's roots or inside one (wire/task_paths.py): OpenCode, in the sandbox's root
    (the host's files), sees an image's work dir at its own path only outside the top-level names that root keeps
    for itself, /home/user and /tmp aside."""
    try:
        confined_dir(workdir)
    except OutsideTaskRoots as error:
        raise SandboxError(f"workdir {workdir[:200]}: outside the task's roots: {error}") from None


async def _made_or_removed(made: asyncio.Future[RolloutTree]) -> RolloutTree:
    """The tree its thread makes. A caller cancelled meanwhile (a setup deadline) waits for the thread to end and
    then removes what it made: cleaning up beside a thread still mounting would leave its mount, and its image
    unheld."""
    try:
        return await asyncio.shield(made)
    except asyncio.CancelledError:
        while not made.done():
            try:
                await asyncio.wait({made})
            except asyncio.CancelledError:
                continue
        if not made.cancelled() and made.exception() is None:
            await asyncio.to_thread(made.result().remove)
        raise


def hosts_file(names: tuple[str, ...]) -> str:
    """/etc/hosts of a rollout with services: theirs on 127.0.0.1 too (a pod's containers share loopback)."""
    return f"{HOSTS}127.0.0.1 {' '.join(names)}\n"


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def _missing_requirement() -> str | None:
    """What this machine lacks that every local sandbox needs (bubblewrap, root), said with what to do."""
    if not bwrap_available():
        return INSTALL_HINT
    return ROOT_HINT if os.geteuid() != 0 else None


class LocalBackend:
    """Creates local sandboxes; the OpenCode binary is installed once per machine by `tools_resolver`. It reads no
    environment: the registry passes the operator's settings (`make_backend`), and each defaults to what an unset
    variable means."""

    name = "local"
    capabilities = Capabilities(
        enforces_limits=True,
        proxy_beside_task_root=False,
        default_concurrency=per_cpu_concurrency(),
        risk="runs commands on this machine",
        runs_services=True,
    )

    def __init__(
        self,
        tools_resolver: ToolsResolver,
        *,
        base_dir: Path | None = None,
        extra_path: tuple[str, ...] = (),
        sandbox_path: tuple[str, ...] = (),
        share_host_network: bool = False,
        admission: MemoryAdmission | None = None,
        image: str = "",
        memory_overcommit: float = DEFAULT_OVERCOMMIT,
        egress_trusted_hosts: frozenset[str] = frozenset(),
        cache_dir: Path | None = None,
        image_archive_dir: Path | None = None,
        image_storage_bytes: int = DEFAULT_IMAGE_STORAGE_MB << 20,
    ) -> None:
        """`image`: what a request naming none runs on (images.default_image: '' is the base image once built, else
        the host's root). `memory_overcommit`: the rollouts' memory limits may add up to this many times the
        machine's memory (admission.py), unless `admission` is given. `egress_trusted_hosts`: names the egress
        proxy lets through even on private addresses. `cache_dir`: where unpacked images are kept (default
        tools.cache_root()). `image_archive_dir`: the operator's directory of image archives a request may name
        (`oci-archive:`/`docker-archive:`); None refuses them. `image_storage_bytes`: the image storage budget
        (images/budget.py) the unpacked cache is charged to, with the task images the builder makes.

        `extra_path`: host directories put on the task's PATH (shown read-only in the sandbox, see
        host_view.sandbox_runtime_paths); `sandbox_path`: directories inside the sandbox put on it first, as they are
        (a fake cloud VM's npm prefix, where a run-time install puts OpenCode).

        `share_host_network=True` runs every sandbox in the host's network namespace, as a cloud VM has a network
        of its own: no egress policy and no loopback isolation (a sandbox reaches whatever the host reaches, the
        host's loopback services included). It is for emulating a cloud VM on one machine (the project's E2B and
        Hugging Face fakes use it), never for untrusted agents on a shared host; the server and the CLI never set
        it, and a sandbox's `enforcement["network"]` says when it was set."""
        self._share_host_network = share_host_network
        self._reaped = False
        self._preflight: Preflight | None = None
        self._tools_resolver = tools_resolver
        self._extra_path = extra_path
        self._sandbox_path = sandbox_path
        self._open = OpenSandboxes()
        self._base_dir = base_dir
        images = (cache_dir or cache_root()) / "images"
        budget = ImageBudget(images, image_storage_bytes)
        self._images = ImageStore(images, archive_dir=image_archive_dir, budget=budget)
        self._configured_image = image
        self._default_image: str | None = None
        self._memory_overcommit = memory_overcommit
        self._trusted_hosts = egress_trusted_hosts
        self._admission = admission

    @property
    def image_progress(self) -> ImageProgress:
        """Where loading an image archive and unpacking an image into the cache are announced (default the log)."""
        return self._images.progress

    @image_progress.setter
    def image_progress(self, progress: ImageProgress) -> None:
        self._images.progress = progress

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        """A sandbox, once its memory limit (and its proxy's) fits this machine's budget: see admission.py."""
        if self._admission is None:
            self._admission = MemoryAdmission(await asyncio.to_thread(memory_budget_mb, self._memory_overcommit))
        services_mb = sum(service.memory_mb for service in spec.services)
        admission = self._admission
        memory_mb = spec.limits.memory_mb + services_mb + PROXY_LIMITS.memory_bytes // 2**20
        if spec.grader_box == "this":
            return await self._create(spec)
        if spec.grader_box == "planned":
            memory_mb = min(memory_mb + spec.limits.memory_mb + services_mb, max(admission.budget_mb, memory_mb))
        await admission.admit(memory_mb)
        try:
            sandbox = await self._create(spec)
        except BaseException:
            admission.release(memory_mb)
            raise
        discard = sandbox.on_close

        def released(closed: LocalSandbox) -> None:
            admission.release(memory_mb)
            if discard is not None:
                discard(closed)

        sandbox.on_close = released
        return sandbox

    async def _create(self, spec: SandboxSpec, *, network_of: int = 0, names: tuple[str, ...] = ()) -> LocalSandbox:
        """A sandbox, and its spec's sidecars in its network; a sidecar itself (`network_of`: the rollout's holder)
        joins that network. `names`: what its /etc/hosts gives 127.0.0.1 (the rollout's services)."""
        names = names or tuple(hosts_names(spec.services))
        if missing := _missing_requirement():
            raise SandboxError(missing)
        tools = await self._tools_resolver()
        if not self._reaped:
            self._reaped = True
            await asyncio.to_thread(reap_orphans, self._base_dir)
        if self._default_image is None:
            self._default_image = await asyncio.to_thread(default_image, self._configured_image)
        ref = "" if spec.image == HOST_IMAGE else spec.image or self._default_image
        if spec.services and (not ref or self._share_host_network):
            raise SandboxError(
                "services: sidecars run beside a sandbox of an image, in a network of its own (not the host's root, "
                "not a shared host network)"
            )
        held = await asyncio.to_thread(self._images.hold, ref) if ref else None
        image = held.image if held is not None else None
        try:  # the image's tree held from here for the sandbox's life: no eviction or prune takes it
            runtime = await asyncio.to_thread(runtime_for) if image is not None else None
            _refuse_workdir_of_ours(spec.workdir)
            mounted = (image.rootfs, spec.workdir) if image is not None else None
            hosts = hosts_file(names) if names else ""
            made = asyncio.ensure_future(
                asyncio.to_thread(
                    make_tree, self._base_dir, spec.limits.disk_mb, HELPERS, runtime, image=mounted, hosts=hosts
                )
            )
            tree = await _made_or_removed(made)
        except BaseException:
            if held is not None:
                held.release()
            raise
        layout = tree.layout
        compartment = Compartment(
            layout,
            tree.lease.ids,
            spec,
            sandbox_tools(tools),
            tools,
            image=image,
            runtime=runtime or HOST_ROOT,
            extra_path=self._extra_path,
            sandbox_path=self._sandbox_path,
            share_host_network=self._share_host_network,
            trusted_hosts=self._trusted_hosts,
            network_of=network_of,
            local_names=names,
        )
        sandbox = LocalSandbox(compartment, tree=tree, image_hold=held)
        if image is not None:
            sandbox.enforcement["image"] = f"{image.ref} ({image.image_id[:19]}), id-mapped overlay"
            if aimed := image_env_aimed_at_us(image.env):
                sandbox.enforcement["image_env"] = (
                    f"set for the task's commands only, never OpenCode or our launchers: {', '.join(aimed)}"
                )
        sandbox.enforcement["disk"] = "loop ext4" if layout.disk_image.exists() else "none (no loop device)"
        sandbox.on_close = self._open.discard
        self._open.add(sandbox)
        try:
            await sandbox.boot()
            if spec.services:
                await self._start_sidecars(sandbox, spec, names)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def _start_sidecars(self, sandbox: LocalSandbox, spec: SandboxSpec, names: tuple[str, ...]) -> None:
        holder = sandbox.holder_pid

        async def create(sidecar: SandboxSpec) -> LocalSandbox:
            return await self._create(sidecar, network_of=holder, names=names)

        await sandbox.sidecars.start(spec.services, spec, create)
        sandbox.enforcement["services"] = f"{sandbox.sidecars.described()}: sandboxes of their own in this network"

    async def preflight(self) -> Preflight:
        """Run the exact isolation once (one `true` command) and keep the verdict: a machine that cannot isolate
        fails every rollout at once with the reason, never as a setup or agent failure."""
        try:
            sandbox = await self.create(SandboxSpec(limits=ResourceLimits(disk_mb=PREFLIGHT_DISK_MB)))
            try:
                ran = await sandbox.run("true", timeout_s=PREFLIGHT_S)
            finally:
                await sandbox.close()
            problem = None if ran.exit_code == 0 else f"a sandbox command failed: {ran.stderr.strip()[-800:]}"
        except Exception as error:
            log.warning("the local backend's preflight failed: %s", error)
            problem = str(error)
        self._preflight = Preflight(f"{problem}. {PREFLIGHT_HINT}" if problem else None, proven=True)
        return self._preflight

    def preflight_verdict(self) -> Preflight:
        """The kept preflight, else whether bubblewrap and root are there."""
        return self._preflight or Preflight(_missing_requirement())

    async def close_all(self) -> int:
        return await self._open.close_all()
