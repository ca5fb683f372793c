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

from opencode_env.sandbox.base import OPENCODE_CONFIG_DIR

SANDBOX_UID = 1000
UID_BASE = 2_000_000_000
UID_SLOTS = 1_000_000
UID_REGISTRY = Path("/run/opencode-env/uids")
SOCKETS_DIR = Path("/run/opencode-env/proxies")
HIDDEN_ROOTS = ("/home", "/tmp", "/run", "/var/tmp", "/root", "/srv", "/mnt", "/media")
CONTROL_MOUNT = "/run/opencode-env"
PASSWD = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n"
GROUP = "root:x:0:\nuser:x:1000:\n"
HOLDER_SCRIPT = "mount -t proc proc /proc && echo ready && exec sleep infinity"


@dataclass(frozen=True)
class HostIds:
    """The two unprivileged host uids of one rollout: its `user` and its proxy / in-sandbox root."""

    user: int
    root: int


class UidLease:
    """A pair of host uids held for one rollout; a lock file makes it exclusive on the machine, and it is released
    when the process holding it ends, however it ends."""

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
            self.ids = HostIds(user=UID_BASE + 2 * slot, root=UID_BASE + 2 * slot + 1)
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


def command_argv(
    holder_pid: int, ids: HostIds, cmd: str, cwd: str, *, own_pid_namespace: bool, privileged: bool
) -> list[str]:
    """Enter the holder's namespaces, drop to the rollout's host uid, run `cmd` as `user` (or as root of a user
    namespace that maps to the rollout's second uid, for privileged steps)."""
    host_uid = ids.root if privileged else ids.user
    inner = ["--map-root-user"] if privileged else [f"--map-user={SANDBOX_UID}", f"--map-group={SANDBOX_UID}"]
    pid_namespace = ["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"] if own_pid_namespace else []
    # Pid 1 of a namespace ignores signals from inside it: a small init keeps the command itself killable from
    # within (the agent's own tools), reaps orphans and passes the command's exit status on.
    init = ["/bin/sh", "-c", '"$@" & wait $!', "init"] if own_pid_namespace else []
    return [
        "nsenter",
        f"--target={holder_pid}",
        "--mount",
        "--pid",
        "--net",
        "--ipc",
        "--uts",
        "--root",
        f"--wdns={cwd}",
        "--",
        "setpriv",
        f"--reuid={host_uid}",
        f"--regid={host_uid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "unshare",
        *inner,
        *pid_namespace,
        "--",
        *init,
        "/bin/bash",
        "-c",
        cmd,
    ]


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
