"""The sandbox seam: what the pipeline needs from any backend (local bubblewrap, E2B, Hugging Face, a test fake):
the narrow core (`Sandbox`) and what a rollout needs beyond it (`RolloutSandbox`).

A command's own failure is a `CommandResult` (exit code, output), never an exception; `SandboxError` means the
sandbox itself could not be created or reached.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from opencode_env.sandbox import tree_carry
from opencode_env.wire import CommandResult, LimitHit, task_paths
from opencode_env.wire.services import Service

HOME = task_paths.HOME
WORKDIR = task_paths.WORKDIR
LOGS_DIR = task_paths.LOGS_DIR
OPENCODE_CONFIG_DIR = task_paths.OPENCODE_CONFIG_DIR
AGENT_LOG_DIR = task_paths.AGENT_LOG_DIR
ROLLOUT_DIR = task_paths.ROLLOUT_DIR
OPENCODE_DATA_DIR = task_paths.OPENCODE_DATA_DIR
VERIFIER_DIR = f"{LOGS_DIR}/verifier"
REWARD_TXT = f"{VERIFIER_DIR}/reward.txt"
REWARD_JSON = f"{VERIFIER_DIR}/reward.json"
REWARD_FILES = (REWARD_TXT, REWARD_JSON)
VERIFIER_DIR_MODE = 0o1775
REWARD_FILE_MODE = 0o664
"""Before verify the verifier directory is the sandbox root's, in the grader's group, with VERIFIER_DIR_MODE (the
grader adds files: a test run's report, its logs; the sticky bit lets none but an entry's owner remove, rename or
replace it) and each of REWARD_FILES an empty regular file of the root's, in the grader's group, with
REWARD_FILE_MODE. So the grader writes a reward but never links, moves or removes the file (unless it is the root),
nothing of the agent's identity writes there at all, and the host finds at each path the file it made."""
CarryLimits = tree_carry.Limits
CarryReport = tree_carry.Report
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024
PROXY_TRACE_READ_BYTES = 256 * 2**20
"""The most of a proxy's trace the host reads back."""
PROXY_FILE_SHARE = 16
MIN_PROXY_FILE_BYTES = 2 * 2**20


def proxy_file_bytes(disk_mb: int) -> int:
    """What each file the capture proxy writes (its trace, its log) may hold: a sixteenth of the rollout's disk, at
    least 2 MiB, at most what the host reads of a trace, so every turn recorded is read back. A flood of large calls
    ends the record, never the disk or the turns recorded before it."""
    return min(max(disk_mb * 2**20 // PROXY_FILE_SHARE, MIN_PROXY_FILE_BYTES), PROXY_TRACE_READ_BYTES)


PROXY_TOKEN_ENV_NAME = "OPENCODE_ENV_PROXY_TOKEN"
"""The variable the backend gives the capture proxy its bearer token in (a fresh one per rollout, never a setting)."""
PRIVATE_ENV_PREFIX = "OPENCODE_ENV_"
"""Variables so named, given to an `agent` command, are OpenCode's alone: where the backend separates OpenCode from
its tools, the tools never see them (the proxy's token travels in one)."""


def task_path(path: str, workdir: str) -> str:
    """Where a task file (`files`, `verify_files`) goes in the sandbox: its own absolute path, or under the work dir."""
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"


HANDED_FILE_MODE = 0o444
"""The task's handed files (verify_files, restored grader files) are the sandbox root's and read-only, in directories
only root writes (`sealed_dirs`): code under test running as the grader cannot rewrite a test, a helper or a running
test.sh, nor swap one. A root grader (verify_as='root', Harbor's default) can: such a task trusts its tests' run."""
UNSEALED_DIRS = frozenset({"/", HOME, LOGS_DIR, VERIFIER_DIR, "/tmp"})


def sealed_dirs(path: str, workdir: str) -> list[str]:
    """The directories above a handed file (a `task_path`) that become the sandbox root's: those below the work dir
    for a file in it (the work dir stays the grader's: tests write there); for a file elsewhere (Harbor's /tests)
    its own directory, unless that is the root, HOME, /tmp, the logs or the work dir or one above it."""
    normal, top = posixpath.normpath(path), posixpath.normpath(workdir)
    parent = posixpath.dirname(normal)
    if normal.startswith(top.rstrip("/") + "/"):
        found = []
        while parent != top:
            found.append(parent)
            parent = posixpath.dirname(parent)
        return found[::-1]
    if parent in UNSEALED_DIRS or top == parent or top.startswith(parent.rstrip("/") + "/"):
        return []
    return [parent]


class SandboxError(Exception):
    """The sandbox could not be created, reached or used (not a command's own failure)."""


Network = Literal["internet", "model_only"]
GraderBoxRole = Literal["none", "planned", "this"]
Identity = Literal["user", "root", "agent", "grader"]
"""Who a sandbox command runs as: `user` (setup, the agent's tools), `root` (the sandbox's root: install steps),
`agent` (OpenCode itself; where the backend can, its tools' shell drops to `user` and loses PRIVATE_ENV_PREFIX
variables, so only OpenCode holds the proxy's token), `grader` (verify: an identity the agent never ran as, with a
fresh HOME and /tmp)."""


@dataclass(frozen=True)
class ResourceLimits:
    """What one rollout may use, counted over everything it runs."""

    memory_mb: int = 4096
    max_processes: int = 1024
    disk_mb: int = 8192
    cpus: float = 2.0


@dataclass(frozen=True)
class SandboxSpec:
    task_id: str = ""
    template: str = ""
    image: str = ""
    """The image whose root file system the sandbox runs ('' = the backend's default; E2B reads it as a template)."""
    workdir: str = WORKDIR
    """The agent's work dir: relative paths of protected files go there, and verify is handed this tree."""
    grader_is_root: bool = False
    """verify_as='root': the `grader` identity is the sandbox's own root (fresh /tmp, HOME /root)."""
    lifetime_s: float = 3600.0
    env: Mapping[str, str] = field(default_factory=dict)
    """The backend's own base environment for every command (our root steps and the capture proxy included): never
    a caller's `env`, which the pipeline passes to the task's own commands alone."""
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    network: Network = "internet"
    model_endpoints: tuple[tuple[str, int], ...] = ()
    """host:port pairs the sandbox may always reach (the model, in black_box mode)."""
    grader_box: GraderBoxRole = "none"
    """planned: the rollout will also open its grader's box, of this spec, within this sandbox's life; this: it is
    that box. The local backend admits the memory of both at once with the agent's (two admitted one by one could
    wait on each other forever); the clouds give each VM its own slot, kept free of that wait (cloud/admission.py)."""
    services: tuple[Service, ...] = ()
    """Sidecars started with the sandbox, in its network (a backend whose capabilities lack `runs_services` refuses
    them); a grader's box of this spec gets fresh ones."""


@dataclass(frozen=True)
class ProxyLaunch:
    """How to run the capture proxy: `python -m opencode_env.proxy` with `args` (the backend adds where it
    listens, its trace and its token) and an environment of its own, which holds the upstream key."""

    python: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    sources: Mapping[str, str] = field(default_factory=dict)
    """The proxy package's files, for backends that upload it (the local one runs the installed package)."""


class ProxyHandle(Protocol):
    """A running capture proxy, out of the sandbox's reach: the agent reaches it at `base_url` with `token`."""

    base_url: str
    token: str
    status_interval_s: float
    """How often the agent phase's progress may ask it how many model calls it recorded: often where asking is a
    socket away, seldom where it starts a process in a VM."""

    async def running(self) -> bool: ...

    async def kill(self) -> None: ...

    async def call(self, path: str, method: str, wait_s: float) -> dict[str, Any] | None:
        """The proxy's JSON answer at path (health, drain), or None when it does not answer in time."""
        ...

    async def read(self, name: str, limit: int) -> bytes:
        """The tail of one of the proxy's own files ('trace.jsonl', 'proxy.log'); b"" when absent."""
        ...


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int


@dataclass(frozen=True)
class ProvidedTools:
    """Programs the backend already put in the sandbox; None means the pipeline must install them."""

    opencode: str | None = None
    opencode_version: str | None = None
    python: str | None = None
    proxy_ready: bool = False
    opencode_config_deps: str | None = None
    """A host directory holding what OpenCode would npm-install into its config directory at start (node_modules,
    package.json, package-lock.json), for backends that mount it there."""


class BackgroundProcess(Protocol):
    async def running(self) -> bool: ...

    async def kill(self) -> None: ...


class Sandbox(Protocol):
    """The core every backend gives, whatever isolates it (Harbor's `BaseEnvironment` in spirit): run a command (a
    result, never an exception for a non-zero exit), start one in the background, move files, close. Reading the
    reward, collecting files, copying a work dir and checking OpenCode's store need nothing more."""

    sandbox_id: str
    backend: str
    tools: ProvidedTools
    opencode_data_dir: str
    """Where OpenCode keeps its sessions and logs (its XDG_DATA_HOME)."""

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
        """Run as `identity` (see Identity). Processes the command leaves in the background die with it, unless
        `keep_background` (setup's services, as `user`), then they live until the sandbox closes."""
        ...

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> BackgroundProcess: ...

    async def write_file(self, path: str, data: str | bytes) -> None:
        """A task's file (a request's `files`), inside the task's roots only (wire/task_paths.py): a path outside
        them raises SandboxError, however it is spelled."""

    async def read_file(self, path: str) -> bytes:
        """The file's bytes; raises FileNotFoundError when it does not exist."""
        ...

    async def read_tail(self, path: str, limit: int) -> bytes:
        """The file's last `limit` bytes; raises FileNotFoundError when it does not exist or is not a plain file."""
        ...

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        """Regular files under root (paths relative to it), at most `limit` of them."""
        ...

    async def close(self) -> None:
        """Kill every process and release the sandbox; safe to call twice."""
        ...


class RolloutSandbox(Sandbox, Protocol):
    """What a rollout needs beyond the core, where how a backend isolates decides how it is done: the local backend
    does these from the host side (outside every namespace of the sandbox), a cloud VM through its root, written once
    for every cloud backend (`sandbox.cloud.sandbox.CloudSandbox`)."""

    enforcement: dict[str, str]
    """What isolation and limits are active (for the result): e.g. {"limits": "cgroup v1", "disk": "loop ext4"}."""
    opencode_isolated: bool
    """True where the agent's tools can neither write OpenCode's data nor call the proxy as OpenCode (the local
    backend): OpenCode's own store then decides which session a call belongs to."""

    async def write_control_file(self, name: str, data: str) -> str:
        """A file task commands can read but not change (the agent's config, the instruction); returns its path."""
        ...

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        """Once the agent's processes are gone: the work dir becomes the grader's, the verifier directory the reward
        channel (REWARD_FILES: the root's files the grader writes and cannot replace), and each protected file (path
        relative to the work dir: text) is written in, replacing whatever the agent left at its path. Nothing the
        agent left in the way (links, files, odd names) fails it."""
        ...

    async def carry_workdir_to(
        self, target: RolloutSandbox, *, keep: tuple[str, ...], limits: CarryLimits
    ) -> CarryReport:
        """Once the agent's processes are gone: `target`'s work dir (a sandbox of the same backend, the grader's box)
        emptied but for its own metadata, then filled with a copy of this one's made by code of ours reading it as
        data (tree_carry.py): regular files and directories only, modes normalised, owned by `target`'s user, within
        `limits`; what was not carried, and a cap passed, are in the report. `keep`: paths relative to the work dir
        the task declares part of the solution although they are metadata."""
        ...

    async def pause_services(self) -> bool:
        """Freeze every process setup left running, until `resume_services`: nothing of the task's runs while
        OpenCode starts and reads its configuration. False where the backend cannot (nothing is paused)."""
        ...

    async def resume_services(self) -> None:
        """Thaw what `pause_services` froze (safe to call when nothing is)."""
        ...

    async def start_proxy(self, launch: ProxyLaunch) -> ProxyHandle:
        """Start the capture proxy where no task command can read its key, its files or its memory."""
        ...

    def limits_hit(self) -> list[LimitHit]:
        """Resource limits the sandbox enforced so far ('memory', 'processes', 'disk')."""
        ...

    async def services_down(self) -> list[str]:
        """The spec's long-running services whose process has exited: its port is then free for anyone on the
        shared loopback to bind, the agent included."""
        ...


class CloseOnce:
    """A sandbox's closing, run once: every caller waits for it, and it runs to its end even if a caller is
    cancelled (a half-closed sandbox would otherwise be skipped by later calls)."""

    def __init__(self, close: Callable[[], Awaitable[None]]) -> None:
        self._close = close
        self._task: asyncio.Future[None] | None = None

    @property
    def started(self) -> bool:
        return self._task is not None

    async def __call__(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._task)


class OpenSandboxes:
    """The sandboxes a backend has open, so that server shutdown can close whatever its rollouts left behind."""

    def __init__(self) -> None:
        self._open: set[Sandbox] = set()

    def add(self, sandbox: Sandbox) -> None:
        self._open.add(sandbox)

    def discard(self, sandbox: Sandbox) -> None:
        self._open.discard(sandbox)

    async def close_all(self) -> int:
        still_open = list(self._open)
        for sandbox in still_open:
            await sandbox.close()
        return len(still_open)


def per_cpu_concurrency() -> int:
    """Two rollouts per CPU of this machine (at least two)."""
    return max(2, (os.cpu_count() or 2) * 2)


@dataclass(frozen=True)
class Capabilities:
    """What a backend does that the rest of the package depends on, declared by the backend on itself
    (tests/contract/test_capabilities.py checks the behavioural ones against what each backend does)."""

    enforces_limits: bool
    """It enforces a rollout's memory, process, disk and CPU limits (else its VM's size bounds a rollout): a
    command past `max_processes` is refused and `limits_hit()` names it."""
    proxy_beside_task_root: bool
    """The capture proxy, which holds the model key, runs where the task's root runs (a cloud VM): root there could
    read the key, so a key from the server's environment must not meet a caller's root."""
    default_concurrency: int
    """Rollouts at once when MAX_CONCURRENT_ENVS does not say."""
    risk: str = "runs rollouts"
    runs_services: bool = False
    """It runs a spec's `services` (sidecars sharing the sandbox's network)."""
    """What it does for whoever reaches a server on it, said to an operator who left the server open."""
    grader_box_at_agent_end: bool = False
    """Its sandboxes cost for as long as they live (a VM billed by the second, a slot of an account's cap): the
    grader's box is opened when the agent ends, not beside it, and admission gives it its own slot then."""


@dataclass(frozen=True)
class Preflight:
    """A backend's answer to "can you run rollouts here?"."""

    problem: str | None = None
    """What stops it, and what to set or do; None when nothing is known wrong."""
    proven: bool = False
    """The answer comes from running what a rollout runs (the local backend's exact isolation, once): a problem then
    refuses every rollout at once. A look at the configuration (a credential set?) proves nothing either way: a
    rollout still tries."""


class SandboxBackend(Protocol):
    """Every backend, the test doubles included, declares what it can do (`capabilities`) and how it checks itself
    (`preflight`) on itself: nothing asks a backend's name what it can do."""

    name: str
    capabilities: Capabilities

    async def create(self, spec: SandboxSpec) -> RolloutSandbox: ...

    async def close_all(self) -> int:
        """Close every sandbox this backend still has open (server shutdown); returns how many."""
        ...

    async def preflight(self) -> Preflight:
        """Check, as thoroughly as the backend can, whether it can run rollouts here (the server runs this once at
        start); the answer is kept for `preflight_verdict`."""
        ...

    def preflight_verdict(self) -> Preflight:
        """What the backend knows now, cheaply: its kept preflight answer, else a look at its configuration."""
        ...
