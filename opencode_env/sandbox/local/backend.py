"""The embedded local backend: one isolated compartment per rollout on this machine (see isolation.py).

What holds, proven by tests/test_hostile.py: sandbox processes run as `user` (uid 1000) mapped to an
unprivileged host uid of their own, with no capability over any host resource; they see the host read-only and
only their own writable tree; they have their own network namespace (loopback, plus an egress proxy that refuses
private addresses); the capture proxy and its key live outside their namespaces; memory, processes, CPU and disk
are limited per rollout; the server reads and writes their tree without following a single symlink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path

from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    HOME,
    VERIFIER_DIR,
    WORKDIR,
    CloseOnce,
    FileEntry,
    Identity,
    OpenSandboxes,
    ProvidedTools,
    ProxyLaunch,
    ResourceLimits,
    SandboxError,
    SandboxSpec,
    task_path,
)
from opencode_env.sandbox.local import hostfs, netns, userns
from opencode_env.sandbox.local.admission import MemoryAdmission, budget_from_env
from opencode_env.sandbox.local.cgroup import PROXY_LIMITS, Cgroup, Limits, detect, proxy_cgroup_name
from opencode_env.sandbox.local.egress import (
    LOOPBACK_NAMES,
    EgressPolicy,
    EgressProxy,
    LoopbackRelay,
    trusted_hosts_from_env,
)
from opencode_env.sandbox.local.host_runtime import BASE_PATH, HOST_ROOT, HostRuntime, host_programs, image_runtime
from opencode_env.sandbox.local.images import HOST_IMAGE, ImageStore, PreparedImage, default_image
from opencode_env.sandbox.local.isolation import (
    AGENT_HOME,
    AGENT_ONLY_ENV,
    CONTROL_MOUNT,
    GRADER_HOME,
    HARBOR_LOGS,
    TOOL_SHELL,
    Helpers,
    Layout,
    Roles,
    UidLease,
    command_argv,
    holder_argv,
    proxy_argv,
)
from opencode_env.sandbox.local.layout import (
    OwnerLock,
    make_layout,
    mount_image,
    own_tree,
    reap_orphans,
    remove_rollout,
    write_launcher,
)
from opencode_env.sandbox.local.proxy import LocalProxy
from opencode_env.sandbox.local.tools import cache_root
from opencode_env.sandbox.output import BoundedOutput
from opencode_env.wire.models import CommandResult, LimitHit

log = logging.getLogger("opencode_env.local")
# Which certificates to trust is machine configuration, not a secret: tasks that install packages need it.
TRUST_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
PIPE_DRAIN_S = 2.0
HOLDER_START_S = 10.0
MAX_READ_BYTES = 64 * 1024 * 1024
EGRESS_PORT = 3128
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
HELPERS = Helpers(python=os.path.realpath(sys.executable), userns=str(Path(userns.__file__).resolve()))


class LocalProcess:
    """A process started in a local sandbox, led by its own process group."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def process(self) -> asyncio.subprocess.Process:
        return self._process

    async def running(self) -> bool:
        return self._process.returncode is None

    async def kill(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            await self._process.wait()


def runtime_paths(tools: ProvidedTools) -> list[str]:
    """Host paths the capture proxy's compartment needs even when they live under a hidden root (its interpreter,
    its packages, this checkout)."""
    paths = {sys.base_prefix, sys.prefix, str(Path(__file__).resolve().parents[3])}
    if tools.python:
        paths.add(str(Path(tools.python).parent.parent))
    return sorted(paths)


def sandbox_runtime_paths(tools: ProvidedTools, extra_path: tuple[str, ...] = ()) -> list[str]:
    """What a sandbox on the host's own system sees of the host beyond its system directories: the standard library
    userns.py and seccomp_exec.py run with (-I -S), userns.py itself, the provided tools (OpenCode's install, the
    Python environment a cloud backend's proxy runs with), the trusted certificates, and the prefix of each host
    directory the backend was asked to put on PATH (a virtualenv's bin: the virtualenv); never the checkout itself,
    its results or anything else of the operator's."""
    paths = {sys.base_prefix, HELPERS.userns, *trust_settings(os.environ).values()}
    if tools.python:
        paths.add(str(Path(tools.python).parent.parent))
    paths.update(prefix for directory in extra_path if os.path.isdir(prefix := str(Path(directory).parent)))
    if tools.opencode:
        paths.add(_install_root(tools.opencode))
    return sorted(paths)


def _install_root(binary: str) -> str:
    """The npm prefix an installed binary lives in (the directory above node_modules), else its directory."""
    resolved = Path(binary).resolve()
    for parent in resolved.parents:
        if parent.name == "node_modules":
            return str(parent.parent)
    return str(resolved.parent)


def trust_settings(host_env: Mapping[str, str]) -> dict[str, str]:
    """The host's CA-bundle settings, also given to npm (whose own config file is hidden with the host home)."""
    settings = {name: host_env[name] for name in TRUST_VARS if host_env.get(name)}
    bundle = settings.get("NODE_EXTRA_CA_CERTS") or settings.get("SSL_CERT_FILE")
    if bundle:
        settings["NPM_CONFIG_CAFILE"] = bundle
    return settings


class LocalSandbox:
    backend = "local"

    def __init__(
        self,
        layout: Layout,
        *,
        lease: UidLease,
        owner_lock: OwnerLock,
        tools: ProvidedTools,
        env: Mapping[str, str],
        spec: SandboxSpec,
        extra_path: tuple[str, ...] = (),
        own_network: bool = True,
        image: PreparedImage | None = None,
        runtime: HostRuntime = HOST_ROOT,
        host_tools: ProvidedTools | None = None,
    ) -> None:
        self._own_network = own_network
        self._host_tools = host_tools or tools
        """The tools as the host has them (`tools` may name their launchers inside an image)."""
        self.image = image
        self._runtime = runtime
        self.layout = layout
        self.root = layout.root
        self.sandbox_id = f"local-{layout.root.name}"
        self.tools = tools
        self.control_dir = CONTROL_MOUNT
        self._lease = lease
        self._owner_lock = owner_lock
        self._ids = lease.ids
        self._spec = spec
        self._base_env = dict(env)
        self._extra_path = extra_path
        self._processes: set[LocalProcess] = set()
        self._holder: asyncio.subprocess.Process | None = None
        self._holder_pid = 0
        self._cgroup: Cgroup | None = None
        self._proxy_cgroup: Cgroup | None = None
        self._egress: EgressProxy | None = None
        self._relays: list[LoopbackRelay] = []
        self.enforcement: dict[str, str] = {}
        self.opencode_data_dir = AGENT_ONLY_ENV["XDG_DATA_HOME"]
        self.opencode_isolated = True
        self.on_close: Callable[[LocalSandbox], None] | None = None
        self._closer = CloseOnce(self._close)

    @property
    def owner(self) -> tuple[int, int]:
        return self._ids.user, self._ids.user

    def _relative(self, path: str) -> tuple[Path, str]:
        """The host directory and the path under it that a sandbox path names (within /home/user or /tmp)."""
        absolute = path if path.startswith("/") else f"{WORKDIR}/{path}"
        normal = os.path.normpath(absolute)
        if normal == HOME or normal.startswith(HOME + "/"):
            return self.layout.home, os.path.relpath(normal, HOME)
        if normal == "/tmp" or normal.startswith("/tmp/"):
            return self.layout.tmp, os.path.relpath(normal, "/tmp")
        if normal == AGENT_HOME or normal.startswith(AGENT_HOME + "/"):
            return self.layout.agent_home, os.path.relpath(normal, AGENT_HOME)
        if self.image is not None:
            if normal == HARBOR_LOGS or normal.startswith(HARBOR_LOGS + "/"):
                return self.layout.home, os.path.normpath(f"logs/{os.path.relpath(normal, HARBOR_LOGS)}")
            return self.layout.image_root, os.path.relpath(normal, "/")
        raise SandboxError(f"path {path!r} is outside the sandbox's writable area ({HOME}, /tmp and {AGENT_HOME})")

    def host_path(self, path: str) -> Path:
        """Where a sandbox path lives on the host (for test doubles only: never open it without hostfs)."""
        base, relative = self._relative(path)
        return base / relative

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
            *self._join(),
            *holder_argv(
                self.layout,
                sandbox_runtime_paths(self._host_tools, self._extra_path),
                own_network=self._own_network,
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
        if not self._own_network:
            self.enforcement["network"] = "the host's (a test double of a cloud VM)"
            return
        self._egress = EgressProxy(
            EgressPolicy(
                internet=self._spec.network == "internet",
                allowed=frozenset(self._spec.model_endpoints),
                trusted_hosts=trusted_hosts_from_env(os.environ),
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

    def _join(self) -> list[str]:
        return self._cgroup.join_prefix() if self._cgroup is not None else []

    def _environment(self, extra: Mapping[str, str] | None, identity: Identity) -> dict[str, str]:
        image_env = self.image.env if self.image is not None else {}
        path = ":".join([*self._extra_path, image_env.get("PATH", BASE_PATH)])
        if self.tools.opencode:
            path = f"{Path(self.tools.opencode).parent}:{path}"
        home = HOME
        if identity == "grader":
            home = "/root" if self._spec.grader_is_root else GRADER_HOME
        env = {**image_env, "PATH": path, "HOME": home, "USER": "user", "TERM": "dumb", "TMPDIR": "/tmp"}
        env.setdefault("LANG", "C.UTF-8")
        if self._own_network:
            proxy = f"http://127.0.0.1:{EGRESS_PORT}"
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[name] = proxy
            env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env.update({name: self._runtime.inside(value) for name, value in trust_settings(os.environ).items()})
        env.update(self._base_env)
        env.update(extra or {})
        if identity == "agent":
            env.update(AGENT_ONLY_ENV, SHELL=TOOL_SHELL)
        return env

    async def _spawn(
        self,
        cmd: str,
        cwd: str,
        env: Mapping[str, str] | None,
        stdout: int,
        stderr: int,
        *,
        own_pid_namespace: bool = True,
        identity: Identity = "user",
    ) -> asyncio.subprocess.Process:
        if self._closer.started:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")
        argv = command_argv(
            self._holder_pid,
            self._ids,
            cmd,
            cwd,
            own_pid_namespace=own_pid_namespace,
            identity=identity,
            helpers=HELPERS,
            tmp_mb=self._spec.limits.disk_mb,
            runtime=self._runtime,
            roles=Roles(grader_is_root=self._spec.grader_is_root),
        )
        return await asyncio.create_subprocess_exec(
            *self._join(),
            *argv,
            env=self._environment(env, identity),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )

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
        started = time.monotonic()
        process = await self._spawn(
            cmd,
            cwd,
            env,
            subprocess.PIPE,
            subprocess.PIPE,
            own_pid_namespace=not keep_background,
            identity=identity,
        )
        handle = LocalProcess(process)
        self._processes.add(handle)
        outputs = (BoundedOutput(max_output_bytes), BoundedOutput(max_output_bytes))
        assert process.stdout is not None
        assert process.stderr is not None
        readers = [
            asyncio.ensure_future(_drain(stream, out))
            for stream, out in zip((process.stdout, process.stderr), outputs, strict=True)
        ]
        timed_out = False
        try:
            await asyncio.wait_for(process.wait(), timeout=max(timeout_s, 0.001))
        except TimeoutError:
            timed_out = True
        finally:
            if timed_out or not keep_background or _cancelling():
                await handle.kill()
            self._processes.discard(handle)
            _, pending = await asyncio.wait(readers, timeout=PIPE_DRAIN_S)
            for reader in pending:
                reader.cancel()
        stdout, stderr = outputs
        return CommandResult(
            cmd=cmd,
            exit_code=None if timed_out else process.returncode,
            stdout=stdout.text(),
            stderr=stderr.text(),
            duration_s=round(time.monotonic() - started, 4),
            timed_out=timed_out,
            output_truncated=stdout.truncated or stderr.truncated,
        )

    async def spawn(
        self, cmd: str, *, env: Mapping[str, str] | None = None, cwd: str = WORKDIR, identity: Identity = "user"
    ) -> LocalProcess:
        """A process with piped stdout and stderr, owned (and killed on close) by the sandbox."""
        process = await self._spawn(cmd, cwd, env, subprocess.PIPE, subprocess.PIPE, identity=identity)
        handle = LocalProcess(process)
        self._processes.add(handle)
        return handle

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> LocalProcess:
        """A background command whose output goes to `log_path`, opened by the command itself inside the sandbox
        (so the server never opens a path the sandbox could have replaced)."""
        logged = f'mkdir -p "$(dirname {_quote(log_path)})" && exec >> {_quote(log_path)} 2>&1; {cmd}'
        process = await self._spawn(logged, cwd, env, subprocess.DEVNULL, subprocess.DEVNULL)
        handle = LocalProcess(process)
        self._processes.add(handle)
        return handle

    async def write_file(self, path: str, data: str | bytes, *, identity: Identity = "user") -> None:
        """Written as `identity` (the sandbox's root writes mode 0600, the others 0644)."""
        base, relative = self._relative(path)
        raw = data.encode("utf-8") if isinstance(data, str) else data
        uid = self._ids.of(identity)
        owner, mode = (uid, uid), 0o600 if identity == "root" else 0o644
        try:
            await asyncio.to_thread(hostfs.write_file, base, relative, raw, owner=owner, mode=mode)
        except hostfs.UnsafePath as error:
            raise SandboxError(f"refusing to write {path}: {error.strerror}") from error

    async def write_control_file(self, name: str, data: str) -> str:
        """A file the sandbox can read but not change or replace; returns its path inside the sandbox."""
        await asyncio.to_thread(hostfs.write_file, self.layout.control, name, data.encode("utf-8"))
        return f"{CONTROL_MOUNT}/{name}"

    async def read_file(self, path: str) -> bytes:
        base, relative = self._relative(path)
        try:
            return await asyncio.to_thread(hostfs.read_file, base, relative, MAX_READ_BYTES)
        except (hostfs.UnsafePath, IsADirectoryError, NotADirectoryError) as error:
            raise FileNotFoundError(path) from error

    async def read_tail(self, path: str, limit: int) -> bytes:
        base, relative = self._relative(path)
        try:
            return await asyncio.to_thread(hostfs.read_tail, base, relative, limit)
        except (hostfs.UnsafePath, IsADirectoryError, NotADirectoryError) as error:
            raise FileNotFoundError(path) from error

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        base, relative = self._relative(root)
        entries = await asyncio.to_thread(hostfs.list_files, base, relative, limit=limit)
        return [FileEntry(entry.path, entry.size) for entry in entries]

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        """From the host side, never following a link the agent left: the work dir becomes the grader's, the
        verifier directory an empty one of the grader's, and each protected file is written in, replacing whatever
        the agent left at its path (a directory in the way of one is replaced too)."""
        grader = (self._ids.grader, self._ids.grader)
        home = self.layout.home
        workdir = self._spec.workdir
        await asyncio.to_thread(hostfs.chown_tree, *self._relative(workdir), owner=grader)
        await asyncio.to_thread(hostfs.reset_dir, home, VERIFIER_DIR.removeprefix(HOME + "/"), owner=grader)
        await asyncio.to_thread(hostfs.reset_dir, self.layout.grader_dir, "home", owner=grader, mode=0o700)
        for path, text in protected.items():
            base, relative = self._relative(task_path(path, workdir))
            await asyncio.to_thread(hostfs.place_file, base, relative, text.encode("utf-8"), owner=grader)

    async def start_proxy(self, launch: ProxyLaunch) -> LocalProxy:
        """The capture proxy, in its own compartment outside the sandbox, listening on 127.0.0.1 inside it."""
        listener = netns.listen_in(self._holder_pid)
        # The sandbox's TCP table, opened here (as root, from the host's user namespace: its uids are host uids),
        # read by the proxy for each call to check that OpenCode's own uid owns the calling socket.
        peer_table = os.open(f"/proc/{self._holder_pid}/net/tcp", os.O_RDONLY | os.O_CLOEXEC)
        try:
            token = secrets.token_urlsafe(24)
            program = [
                launch.python,
                "-I",
                "-m",
                "opencode_env.proxy",
                *launch.args,
                "--listen-fd",
                str(listener.fileno()),
                "--admin-socket",
                str(self.layout.sockets / "admin.sock"),
                "--trace",
                str(self.layout.private / "trace.jsonl"),
                "--token-env",
                "OPENCODE_ENV_PROXY_TOKEN",
                "--peer-table-fd",
                str(peer_table),
                "--peer-uid",
                str(self._ids.agent),
            ]
            argv = proxy_argv(self.layout, self._ids, runtime_paths(self._host_tools), program)
            if self._proxy_cgroup is not None:
                argv = [*self._proxy_cgroup.join_prefix(), *argv]
            log_file = self.layout.private / "proxy.log"
            with log_file.open("ab") as log_handle:
                os.fchown(log_handle.fileno(), self._ids.root, self._ids.root)
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env={"PATH": BASE_PATH, "OPENCODE_ENV_PROXY_TOKEN": token, **launch.env},
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle.fileno(),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(listener.fileno(), peer_table),
                )
            port = listener.getsockname()[1]
        finally:
            listener.close()
            os.close(peer_table)
        handle = LocalProcess(process)
        self._processes.add(handle)
        return LocalProxy(handle, self.layout.private, self.layout.sockets / "admin.sock", port=port, token=token)

    def limits_hit(self) -> list[LimitHit]:
        """The cgroup's record of what it enforced, and `disk` when the rollout's own file system is full now (the
        kernel keeps no count of refused writes; the 1% kept for the host does not count)."""
        hit = self._cgroup.limits_hit() if self._cgroup is not None else []
        if self.layout.disk_image.exists():
            free = os.statvfs(self.layout.fs)
            if free.f_bavail * free.f_frsize < DISK_FULL_BYTES:
                hit.append("disk")
        return hit

    def egress_attempts(self) -> list[str]:
        if self._egress is None:
            return []
        return [
            f"{a.host}:{a.port} {'allowed' if a.allowed else 'refused'} ({a.reason})" for a in self._egress.attempts
        ]

    async def close(self) -> None:
        await self._closer()

    async def _close(self) -> None:
        """Each step runs whatever the one before it did: a sandbox is never left half-released."""
        try:
            for process in list(self._processes):
                await process.kill()
            self._processes.clear()
            if self._egress is not None:
                await self._egress.close()
            for relay in self._relays:
                await relay.close()
        finally:
            try:
                await self._stop_holder()
            finally:
                try:
                    for cgroup in (self._cgroup, self._proxy_cgroup):
                        if cgroup is not None:
                            await asyncio.to_thread(cgroup.destroy)
                finally:
                    try:
                        await asyncio.to_thread(remove_rollout, self.layout)
                    finally:
                        self._owner_lock.release()
                        self._lease.release()
                        if self.on_close is not None:
                            self.on_close(self)

    async def _stop_holder(self) -> None:
        if self._holder is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._holder.pid, signal.SIGKILL)
        await self._holder.wait()


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _sandbox_init_pid(bwrap_pid: int) -> int:
    """The pid (as the host sees it) of pid 1 of the holder's namespaces: bubblewrap's only child."""
    children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    if not children:
        raise SandboxError("the sandbox's holder has no init process")
    return int(children[0])


async def _drain(stream: asyncio.StreamReader, out: BoundedOutput) -> None:
    while chunk := await stream.read(65536):
        out.feed(chunk)


def _runtime_for(tools: ProvidedTools) -> HostRuntime:
    """The host programs an image's sandbox starts, and what of the host they read: the interpreter's standard
    library (userns.py and seccomp_exec.py run with -I -S), userns.py itself, the certificates the host trusts."""
    extra = [os.path.realpath(HELPERS.python)]
    if tools.opencode:
        extra.append(os.path.realpath(tools.opencode))
    if ripgrep := shutil.which("rg", path=BASE_PATH):
        extra.append(ripgrep)
    shown = [sys.base_prefix, HELPERS.userns, *trust_settings(os.environ).values()]
    return image_runtime(host_programs(extra), tuple(shown))


def _launched_tools(layout: Layout, tools: ProvidedTools, runtime: HostRuntime) -> ProvidedTools:
    """In an image, OpenCode (and ripgrep, which its search tools run) start through launchers in the control
    directory, which run the host's binaries with the host's loader and libraries."""
    if ripgrep := shutil.which("rg", path=BASE_PATH):
        write_launcher(layout, "rg", runtime.program(ripgrep))
    if not tools.opencode:
        return tools
    launcher = write_launcher(layout, "opencode", runtime.program(os.path.realpath(tools.opencode)))
    return replace(tools, opencode=launcher)


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


class LocalBackend:
    """Creates local sandboxes; the OpenCode binary is installed once per machine by `tools_resolver`."""

    name = "local"

    def __init__(
        self,
        tools_resolver: ToolsResolver,
        *,
        base_dir: Path | None = None,
        extra_path: tuple[str, ...] = (),
        own_network: bool = True,
        admission: MemoryAdmission | None = None,
    ) -> None:
        self._own_network = own_network
        self._reaped = False
        self._preflight: str | None = None
        self._tools_resolver = tools_resolver
        self._extra_path = extra_path
        self._open = OpenSandboxes()
        self._base_dir = base_dir
        self._images = ImageStore(cache_root() / "images")
        self._default_image: str | None = None
        self._admission = admission

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        """A sandbox, once its memory limit (and its proxy's) fits this machine's budget: see admission.py."""
        if self._admission is None:
            self._admission = MemoryAdmission(await asyncio.to_thread(budget_from_env))
        admission, memory_mb = self._admission, spec.limits.memory_mb + PROXY_LIMITS.memory_bytes // 2**20
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

    async def _create(self, spec: SandboxSpec) -> LocalSandbox:
        if not bwrap_available():
            raise SandboxError(INSTALL_HINT)
        if os.geteuid() != 0:
            raise SandboxError(ROOT_HINT)
        tools = await self._tools_resolver()
        if not self._reaped:
            self._reaped = True
            await asyncio.to_thread(reap_orphans, self._base_dir)
        if self._default_image is None:
            self._default_image = await asyncio.to_thread(default_image)
        ref = "" if spec.image == HOST_IMAGE else spec.image or self._default_image
        image = await asyncio.to_thread(self._images.prepare, ref) if ref else None
        runtime = await asyncio.to_thread(_runtime_for, tools) if image is not None else None
        if image is not None and not image.has_shell:
            raise SandboxError(f"image {ref} has no /bin/sh: the agent's tools and the task's commands need one")
        layout, owner_lock = await asyncio.to_thread(make_layout, self._base_dir, spec.limits.disk_mb, runtime)
        try:
            lease = await asyncio.to_thread(UidLease)
            await asyncio.to_thread(own_tree, layout, lease.ids)
            host_tools = tools
            if image is not None and runtime is not None:
                await asyncio.to_thread(mount_image, layout, image.rootfs, lease.ids)
                tools = _launched_tools(layout, tools, runtime)
        except BaseException:
            await asyncio.to_thread(remove_rollout, layout)
            owner_lock.release()
            raise
        sandbox = LocalSandbox(
            layout,
            lease=lease,
            owner_lock=owner_lock,
            tools=tools,
            env=spec.env,
            spec=spec,
            extra_path=self._extra_path,
            own_network=self._own_network,
            image=image,
            runtime=runtime or HOST_ROOT,
            host_tools=host_tools,
        )
        if image is not None:
            sandbox.enforcement["image"] = f"{image.ref} ({image.image_id[:19]}), id-mapped overlay"
        sandbox.enforcement["disk"] = "loop ext4" if layout.disk_image.exists() else "none (no loop device)"
        sandbox.on_close = self._open.discard
        self._open.add(sandbox)
        try:
            await sandbox.boot()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def preflight(self) -> str | None:
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
        self._preflight = f"{problem}. {PREFLIGHT_HINT}" if problem else None
        return self._preflight

    def preflight_problem(self) -> str | None:
        return self._preflight

    async def close_all(self) -> int:
        return await self._open.close_all()
