"""The local backend's process model, as argv builders (pure) plus the host uids a rollout runs as.

One long-lived holder per rollout (bubblewrap, started as root) owns the rollout's mount, PID, network, IPC and
UTS namespaces: the host's root filesystem read-only, host-only places (/home, /tmp, /run, /root, ...) hidden,
the rollout's own tree mounted at /home/user and /tmp, loopback as its only network. Every command enters those
namespaces (nsenter), drops to the rollout's own unprivileged host uid (setpriv) and runs as uid 1000 in a user
namespace of its own (unshare), so no process of the sandbox holds a capability over any host resource. Agent and
verify commands also get a PID namespace of their own, so killing a command ends everything it started; setup
commands run in the holder's, so services they leave in the background live until the sandbox closes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opencode_env.sandbox.base import OPENCODE_CONFIG_DIR, Identity

SANDBOX_UID = 1000
GRADER_UID = 1001
UID_BASE = 2_000_000_000
UID_SLOTS = 1_000_000
UIDS_PER_SLOT = 4
UID_REGISTRY = Path("/run/opencode-env/uids")
SOCKETS_DIR = Path("/run/opencode-env/proxies")
HIDDEN_ROOTS = ("/home", "/tmp", "/run", "/var/tmp", "/root", "/srv", "/mnt", "/media")
CONTROL_MOUNT = "/run/opencode-env"
PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n"
    "grader:x:1001:1001:grader:/home/grader/home:/bin/bash\n"
)
GROUP = "root:x:0:\nuser:x:1000:\ngrader:x:1001:\n"
GRADER_DIR = "/home/grader"
GRADER_HOME = f"{GRADER_DIR}/home"
AGENT_HOME = "/home/opencode"
AGENT_ONLY_ENV = {
    "XDG_DATA_HOME": f"{AGENT_HOME}/data",
    "XDG_STATE_HOME": f"{AGENT_HOME}/state",
    "XDG_CACHE_HOME": f"{AGENT_HOME}/cache",
    # OpenCode runs git on the work dir as itself: no configuration the tools can write may name a program for it.
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.fsmonitor",
    "GIT_CONFIG_VALUE_0": "false",
    "GIT_CONFIG_KEY_1": "core.hooksPath",
    "GIT_CONFIG_VALUE_1": "/dev/null",
}
HOLDER_SCRIPT = "mount -t proc proc /proc && echo ready && exec sleep infinity"


@dataclass(frozen=True)
class HostIds:
    """The unprivileged host uids of one rollout: its `user`, its proxy / in-sandbox root, OpenCode, the grader."""

    user: int
    root: int
    agent: int
    grader: int

    def of(self, identity: Identity) -> int:
        return {"user": self.user, "root": self.root, "agent": self.agent, "grader": self.grader}[identity]


class UidLease:
    """Four host uids held for one rollout; a lock file makes them exclusive on the machine, and they are released
    when the process holding them ends, however it ends."""

    def __init__(self, registry: Path = UID_REGISTRY) -> None:
        registry.mkdir(parents=True, exist_ok=True, mode=0o700)
        for _ in range(64):
            slot = random.randrange(UID_SLOTS)
            handle = (registry / str(slot)).open("a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self._handle = handle
            first = UID_BASE + UIDS_PER_SLOT * slot
            self.ids = HostIds(user=first, root=first + 1, agent=first + 2, grader=first + 3)
            return
        raise RuntimeError("no free host uid pair for a sandbox")

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._handle.name)
        self._handle.close()


@dataclass(frozen=True)
class Layout:
    """Where a rollout's parts live on the host."""

    root: Path

    @property
    def fs(self) -> Path:
        return self.root / "fs"

    @property
    def home(self) -> Path:
        return self.fs / "home" / "user"

    @property
    def tmp(self) -> Path:
        return self.fs / "tmp"

    @property
    def agent_home(self) -> Path:
        """OpenCode's own directory (its sessions, logs, caches), which its tools can neither read nor replace."""
        return self.fs / "opencode"

    @property
    def grader_dir(self) -> Path:
        """The grader's own directory (its HOME is made afresh there before verify); the agent cannot enter it."""
        return self.fs / "grader"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def private(self) -> Path:
        return self.root / "private"

    @property
    def sockets(self) -> Path:
        """The proxy's admin socket directory: a short path, since a unix socket's path is limited to 107 bytes
        and a rollout's tree may live deep (a CI checkout, pytest's temporary directories)."""
        return SOCKETS_DIR / self.root.name

    @property
    def disk_image(self) -> Path:
        return self.root / "disk.img"


def _binds_under_hidden(paths: Sequence[str], writable: Sequence[str] = ()) -> list[str]:
    """Re-expose runtime paths that a hidden root covers. bubblewrap creates the directories leading to them with
    their host modes (a 0700 CI checkout or /root), which the sandbox's uid could not cross: those directories
    exist only in the sandbox's tmpfs, so they are opened up there (never a host directory)."""
    hidden = (*HIDDEN_ROOTS, _host_home())
    bound = [path for path in [*paths, *writable] if any(path.startswith(root + "/") for root in hidden)]
    argv: list[str] = []
    for path in paths:
        if path in bound:
            argv += ["--ro-bind", path, path]
    for path in writable:
        argv += ["--bind", path, path]
    leading: set[str] = set()
    for path in bound:
        root = next(root for root in hidden if path.startswith(root + "/"))
        parts = path[len(root) + 1 :].split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            leading.add(f"{root}/{'/'.join(parts[:depth])}")
    for directory in sorted(leading):
        if not any(directory == path or directory.startswith(path + "/") for path in bound):
            argv += ["--chmod", "0755", directory]
    return argv


def _host_home() -> str:
    home = os.path.expanduser("~")
    return home if home not in ("", "/") else "/nonexistent"


def _hidden_tmpfs() -> list[str]:
    argv: list[str] = []
    for root in sorted({*HIDDEN_ROOTS, _host_home()}):
        if os.path.isdir(root) and not any(root.startswith(other + "/") for other in HIDDEN_ROOTS):
            argv += ["--tmpfs", root]
    return argv


def holder_argv(
    layout: Layout, runtime_paths: Sequence[str], *, own_network: bool = True, config_deps: str | None = None
) -> list[str]:
    """The rollout's namespace holder. It keeps CAP_SYS_ADMIN in its namespaces only to mount a /proc of its own
    (bubblewrap's covers parts of /proc, which would stop commands mounting theirs); it then just sleeps.
    `own_network=False` is for test doubles of cloud sandboxes, which have the network of a VM. `config_deps`, a
    cached install of what OpenCode would npm-install into its config directory at start, is mounted there
    read-only: OpenCode finds it in place and contacts no registry."""
    return [
        "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        *(["--unshare-net"] if own_network else []),
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--cap-add",
        "CAP_SYS_ADMIN",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        *_hidden_tmpfs(),
        "--bind",
        str(layout.home),
        "/home/user",
        "--bind",
        str(layout.tmp),
        "/tmp",
        "--bind",
        str(layout.agent_home),
        AGENT_HOME,
        "--bind",
        str(layout.grader_dir),
        GRADER_DIR,
        *_config_deps_binds(config_deps),
        "--ro-bind",
        str(layout.control),
        CONTROL_MOUNT,
        "--ro-bind",
        str(layout.control / "passwd"),
        "/etc/passwd",
        "--ro-bind",
        str(layout.control / "group"),
        "/etc/group",
        *_binds_under_hidden(runtime_paths),
        "--chdir",
        "/",
        "--",
        "/bin/sh",
        "-c",
        HOLDER_SCRIPT,
    ]


def _config_deps_binds(config_deps: str | None) -> list[str]:
    if config_deps is None:
        return []
    binds: list[str] = []
    for name in ("node_modules", "package.json", "package-lock.json"):
        binds += ["--ro-bind", f"{config_deps}/{name}", f"{OPENCODE_CONFIG_DIR}/{name}"]
    return binds


AGENT_CAPS = "+setuid,+setgid,+dac_override,+kill"
"""What OpenCode keeps, inside its own user namespace only: switching its tools' shell to `user`, reading and
writing the files of the sandbox's two identities (its own and `user`'s), as the agent's edit tools must, and
stopping a tool command that ran past its timeout."""
TOOL_SHELL = f"{CONTROL_MOUNT}/shell/bash"
AGENT_UMASK = "002"


@dataclass(frozen=True)
class Helpers:
    """Host programs every sandbox command may start with: a Python and the user-namespace starter (userns.py)."""

    python: str
    userns: str


def command_argv(
    holder_pid: int,
    ids: HostIds,
    cmd: str,
    cwd: str,
    *,
    own_pid_namespace: bool,
    identity: Identity,
    helpers: Helpers,
    tmp_mb: int = 1024,
) -> list[str]:
    """Enter the holder's namespaces, then run `cmd` as `identity` (see Identity) with no capability over any host
    resource: `user` through setpriv + unshare (one mapped uid); `root`, `agent` and `grader` through userns.py,
    whose maps (several uids) this still-privileged process writes. The sandbox's root maps `user` and `grader`
    too, so it can hand files between them as a VM's root would; OpenCode's namespace maps only itself and `user`;
    the grader's only itself (and the root that mounts its fresh /tmp before dropping to it)."""
    enter = ["nsenter", f"--target={holder_pid}", "--mount", "--pid", "--net", "--ipc", "--uts", "--root"]
    enter += [f"--wdns={cwd}", "--"]
    # Pid 1 of a namespace ignores signals from inside it: a small init keeps the command itself killable from
    # within (the agent's own tools), reaps orphans and passes the command's exit status on.
    init = ["/bin/sh", "-c", '"$@" & wait $!', "init"] if own_pid_namespace else []
    command = [*init, "/bin/bash", "-c", cmd]
    pid_namespace = ["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"] if own_pid_namespace else []
    if identity == "agent":
        mapped = _userns(helpers, {0: ids.agent, SANDBOX_UID: ids.user}, gid=SANDBOX_UID)
        return [*enter, *mapped, *pid_namespace, "--", *_agent(command)]
    if identity == "grader":
        mapped = _userns(helpers, {0: ids.root, GRADER_UID: ids.grader}, gid=0)
        return [*enter, *mapped, *pid_namespace, "--", *_grader(command, tmp_mb)]
    if identity == "root":
        mapped = _userns(helpers, {0: ids.root, SANDBOX_UID: ids.user, GRADER_UID: ids.grader}, gid=0)
        return [*enter, *mapped, *pid_namespace, "--", *command]
    return [
        *enter,
        "setpriv",
        f"--reuid={ids.user}",
        f"--regid={ids.user}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "unshare",
        f"--map-user={SANDBOX_UID}",
        f"--map-group={SANDBOX_UID}",
        *pid_namespace,
        "--",
        *command,
    ]


def _userns(helpers: Helpers, mapping: dict[int, int], *, gid: int) -> list[str]:
    maps = [f"--map={inside}:{outside}" for inside, outside in mapping.items()]
    return [helpers.python, "-I", "-S", helpers.userns, *maps, f"--gid={gid}", "--", "unshare"]


def _drop_to(uid: int) -> list[str]:
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def _agent(command: list[str]) -> list[str]:
    """OpenCode as its namespace's root, holding only AGENT_CAPS; the umask lets its tools change what it writes."""
    caps = f"-all,{AGENT_CAPS}"
    keep = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--no-new-privs", "--"]
    return ["/bin/sh", "-c", f'umask {AGENT_UMASK} && exec "$@"', "agent", *keep, *command]


def _grader(command: list[str], tmp_mb: int) -> list[str]:
    """A fresh /tmp, mounted while still root of the namespace, then the grader's uid with no capability at all
    (its HOME, made empty by the host before verify, is in its own directory, which the agent could not enter)."""
    fresh = f'mount -t tmpfs -o mode=1777,nosuid,nodev,size={tmp_mb}m verify-tmp /tmp && exec "$@"'
    return ["/bin/sh", "-c", fresh, "grader", *_drop_to(GRADER_UID), *command]


def tool_shell_script(private_prefix: str, agent_vars: Sequence[str]) -> str:
    """The shell OpenCode starts its tools with (named bash, given as SHELL): the tools run as `user`, without
    OpenCode's private variables (every name starting with `private_prefix`: its key) and directories, before the
    real bash starts."""
    names = f"s/^\\({private_prefix}[A-Za-z0-9_]*\\)=.*/\\1/p"
    unset = " ".join(f"-u {name}" for name in agent_vars)
    drop = " ".join(_drop_to(SANDBOX_UID))
    return (
        "#!/bin/sh\numask 022\n"
        f"for name in $(env | sed -n '{names}'); do unset \"$name\"; done\n"
        f'exec env {unset} SHELL=/bin/bash {drop} /bin/bash "$@"\n'
    )


def proxy_argv(layout: Layout, ids: HostIds, runtime_paths: Sequence[str], program: Sequence[str]) -> list[str]:
    """The capture proxy's compartment: outside the sandbox's namespaces (the host network, to reach the model),
    its own PID namespace, the host read-only, nothing of the sandbox's tree, its private directory writable,
    the rollout's second unprivileged uid, no capabilities."""
    private = str(layout.private)
    return [
        "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        *_hidden_tmpfs(),
        *_binds_under_hidden(runtime_paths, writable=[private, str(layout.sockets)]),
        "--chdir",
        private,
        "--",
        "setpriv",
        f"--reuid={ids.root}",
        f"--regid={ids.root}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        *program,
    ]
