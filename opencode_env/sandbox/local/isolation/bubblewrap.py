"""The local backend's compartments, as bubblewrap argv builders (pure): the sandbox's namespace holder and the
capture proxy's compartment beside it, and where a rollout's parts live on the host (Layout).

One long-lived holder per rollout (bubblewrap, started as root) owns the rollout's mount, PID, network, IPC and
UTS namespaces: an image's tree as its root (or, for image "host", the host's system directories read-only and
nothing else of the host: SYSTEM_DIRS), the rollout's own tree mounted at /home/user and /tmp, loopback as its only
network. Every command enters those namespaces as one of the sandbox's identities (command_argv.py), under the
rollout's own unprivileged host uids (host_ids.py), so no process of the sandbox holds a capability over any host
resource.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opencode_env.sandbox.base import LOGS_DIR, SandboxError
from opencode_env.sandbox.local.isolation.host_ids import HostIds
from opencode_env.sandbox.local.isolation.host_runtime import HOST_MOUNT, HOST_ROOT, HostRuntime

SOCKETS_DIR = Path("/run/opencode-env/proxies")
SYSCALL_FILTER = "syscalls.bpf"
AGENT_SYSCALL_FILTER = "agent-syscalls.bpf"
SECCOMP_EXEC = "seccomp_exec.py"
"""The syscall filters (syscall_filter.py: the task's, and OpenCode's, which allows chroot) and their loader, in the
control directory: every command is started under one."""
USERNS = "userns.py"
"""The user-namespace starter, copied into the control directory too."""
TASK_ROOT = "/run/opencode-task"
"""Where the image's tree (the task's root) is mounted in the sandbox's own root, which is made of the host's files.
Our launchers and OpenCode run in the sandbox's root; each task command enters TASK_ROOT as its last step
(seccomp_exec.py), so nothing of ours resolves a path (a shell, the dynamic loader's /etc/ld.so.preload, a library,
a config dir) in the image."""
OUR_TOP_LEVEL = frozenset(
    {
        "bin",
        "boot",
        "dev",
        "etc",
        "home",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "root",
        "run",
        "sbin",
        "sys",
        "tmp",
        "usr",
        "var",
    }
)
"""Top-level names of the sandbox's root that are ours (the host's system directories, the places our programs
read, such as /var/run/nscd, and our binds): an image's directories of the same names are seen only in TASK_ROOT.
The image's other top-level directories (/app, /opt, /srv, ...) are bound at their own names too, so OpenCode's
file tools see the task's files where its bash tool does."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""All a sandbox on the host's own system (image "host") sees of the host, read-only: its programs, libraries and
their configuration. The operator's files (checkouts and their results, homes, /opt, /srv, /var, data directories
anywhere) are not there at all; the runtime paths our programs need are bound one by one."""
EMPTY_DIRS = ("/tmp", "/var/tmp", "/run", "/home", "/root")
CONTROL_MOUNT = "/run/opencode-env"
RUNTIME_MOUNT = "/run/opencode-runtime"
"""Where the sandbox's root shows the host's runtime paths (the interpreter our helpers run with, OpenCode's install,
the trusted certificates), each at RUNTIME_MOUNT + its host path: a read-only tmpfs of the host's root (unmapped in
every user namespace of the sandbox) under /run, which is another, so no identity of the sandbox can write, rename or
mount over any directory on the way to what our programs start. Our programs are started from there, never from a
host path, which may lie in a place the task writes (/tmp, /home/user)."""
PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n"
    "grader:x:1001:1001:grader:/home/grader/home:/bin/bash\n"
)
GROUP = "root:x:0:\nuser:x:1000:\ngrader:x:1001:\n"
GRADER_DIR = "/home/grader"
GRADER_HOME = f"{GRADER_DIR}/home"
AGENT_HOME = "/home/opencode"
TASK_WRITABLE = ("/home/user", "/tmp", AGENT_HOME, GRADER_DIR)
"""The sandbox root's places some identity of the sandbox writes (the holder binds the rollout's own directories
there): a host path under one is never shown at its own place (see runtime_binds)."""
AGENT_TMP = f"{AGENT_HOME}/tmp"
"""OpenCode's TMPDIR: its own (the sandbox's /tmp is the task's to plant in)."""
MANAGED_CONFIG_DIR = f"{CONTROL_MOUNT}/managed-config"
"""An empty directory of ours that OpenCode reads as its managed config dir instead of /etc/opencode."""
AGENT_CONFIG_DIR = f"{AGENT_HOME}/config/opencode"
"""OpenCode's global config dir (its ~/.config/opencode): under its own home, which no sandbox process can write;
only our read-only dependency install is mounted there."""
AGENT_ONLY_ENV = {
    "XDG_CONFIG_HOME": f"{AGENT_HOME}/config",
    # OpenCode's ~ for ~/.opencode (a config and plugin dir it always reads): its own home, not /home/user.
    "OPENCODE_TEST_HOME": AGENT_HOME,
    "XDG_DATA_HOME": f"{AGENT_HOME}/data",
    "XDG_STATE_HOME": f"{AGENT_HOME}/state",
    "XDG_CACHE_HOME": f"{AGENT_HOME}/cache",
    "OPENCODE_TEST_MANAGED_CONFIG_DIR": MANAGED_CONFIG_DIR,
    # OpenCode runs git on the work dir as itself: no configuration the tools can write may name a program for it.
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.fsmonitor",
    "GIT_CONFIG_VALUE_0": "false",
    "GIT_CONFIG_KEY_1": "core.hooksPath",
    "GIT_CONFIG_VALUE_1": "/dev/null",
}
HARBOR_LOGS = "/logs"
"""Where Harbor's tests write (/logs/verifier/reward.txt): in an image, the rollout's own logs directory."""
HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 sandbox\n"


UNPRIVILEGED_PORT_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"


def holder_script(task_root: bool, *, own_network: bool = True) -> str:
    """The holder mounts the sandbox's /proc (and the task root's) and sleeps; it runs from the host's files. In
    the sandbox's own network namespace every port may be bound (ports below 1024 too, as a container's root binds
    port 80): the namespace holds the sandbox alone, and our listeners in it are bound before any task code runs."""
    task_proc = f"mount -t proc proc {TASK_ROOT}/proc && " if task_root else ""
    ports = f"echo 0 > {UNPRIVILEGED_PORT_START} && " if own_network else ""
    return f"mount -t proc proc /proc && {task_proc}{ports}echo ready && exec sleep infinity"


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
    def inode_reserve(self) -> Path:
        """Empty files of the host's on the rollout's disk, outside every view of the sandbox: removed at the
        hand-over, they give back the inodes the grader's files need, however many the agent used up."""
        return self.fs / "inode-reserve"

    @property
    def task_hosts(self) -> Path:
        """The task root's /etc/hosts: ours at start, the sandbox root's to change (a container's root adds
        entries to its /etc/hosts); on the rollout's own disk, seen by nothing outside the sandbox."""
        return self.fs / "hosts"

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

    @property
    def image_lower(self) -> Path:
        """The image's cached tree, id-mapped for this rollout (read-only)."""
        return self.root / "image-lower"

    @property
    def image_root(self) -> Path:
        """The rollout's root file system when it runs an image: the overlay of its changes on image_lower."""
        return self.root / "rootfs"


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _outside_system(path: str) -> bool:
    return not _under(path, SYSTEM_DIRS)


def _runtime_binds(paths: Sequence[str], hidden: Callable[[str], bool], writable: Sequence[str] = ()) -> list[str]:
    """Bind the runtime paths that `hidden` says the root does not show. bubblewrap creates the directories leading
    to them with their host modes (a 0700 CI checkout, /root, a 0700 test directory), which an unprivileged uid
    could not cross: those directories exist only in the compartment's own tmpfs, so they are opened up there
    (never a host directory)."""
    bound = [path for path in [*paths, *writable] if hidden(path)]
    argv: list[str] = []
    for path in paths:
        if path in bound:
            argv += ["--ro-bind", path, path]
    for path in writable:
        argv += ["--bind", path, path]
    leading = {
        "/" + "/".join(path.strip("/").split("/")[:depth]) for path in bound for depth in range(1, path.count("/"))
    }
    for directory in sorted(leading):
        if hidden(directory) and not any(directory == path or directory.startswith(path + "/") for path in bound):
            argv += ["--chmod", "0755", directory]
    return argv


def runtime_inside(host_path: str) -> str:
    """Where the sandbox's root shows a host runtime path (one of those given to holder_argv, or inside one)."""
    return RUNTIME_MOUNT + host_path


def runtime_binds(paths: Sequence[str]) -> list[str]:
    """The host's runtime paths, read-only at RUNTIME_MOUNT + their host paths (a tmpfs remounted read-only), where
    our programs are started from; also at their own places outside the system directories (already shown), for
    what those programs find by an absolute host path (a virtualenv's link to its interpreter, a RUNPATH). There the
    directories leading to them are the holder's own, on its root-owned tmpfs, except under TASK_WRITABLE: a path
    there is shown inside a read-only tmpfs mounted on its first directory in that place (a mount point, which no
    identity of the sandbox can rename, remove or write), never on a directory the task made."""
    if covering := [path for path in paths if any(_under(place, [path]) for place in TASK_WRITABLE)]:
        raise SandboxError(f"{covering[0]} would cover a place the sandbox gives its task ({', '.join(TASK_WRITABLE)})")
    argv = ["--tmpfs", RUNTIME_MOUNT]
    for path in paths:
        argv += ["--ro-bind", path, runtime_inside(path)]
    for directory in _ancestors(paths):
        argv += ["--chmod", "0755", runtime_inside(directory)]
    argv += ["--remount-ro", RUNTIME_MOUNT]
    shown = [path for path in paths if _outside_system(path)]
    shadows = sorted({_shadow(path) for path in shown if _under(path, TASK_WRITABLE)})
    for shadow in shadows:
        argv += ["--tmpfs", shadow]
    for path in shown:
        argv += ["--ro-bind", path, path]
    for directory in _ancestors(shown):
        if directory not in TASK_WRITABLE and _outside_system(directory):
            argv += ["--chmod", "0755", directory]
    for shadow in shadows:
        argv += ["--remount-ro", shadow]
    return argv


def _shadow(path: str) -> str:
    """The directory just below the TASK_WRITABLE place that holds `path`."""
    place = next(place for place in TASK_WRITABLE if _under(path, [place]))
    return f"{place}/{os.path.relpath(path, place).split('/')[0]}"


def _system_dirs() -> list[str]:
    """SYSTEM_DIRS read-only, a merged-/usr link as a link."""
    argv: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def system_root() -> list[str]:
    """The root of a sandbox on the host's own system: SYSTEM_DIRS read-only, empty places to write, and nothing
    else of the host."""
    argv = [*_system_dirs(), "--dev", "/dev", "--dir", "/proc"]
    for path in EMPTY_DIRS:
        argv += ["--tmpfs", path]
    return argv


def holder_argv(
    layout: Layout,
    runtime_paths: Sequence[str],
    *,
    share_host_network: bool = False,
    config_deps: str | None = None,
    image_root: Path | None = None,
    runtime: HostRuntime = HOST_ROOT,
) -> list[str]:
    """The rollout's namespace holder. It keeps CAP_SYS_ADMIN in its namespaces only to mount a /proc of its own
    (bubblewrap's covers parts of /proc, which would stop commands mounting theirs); it then just sleeps.
    `share_host_network` leaves it in the host's network namespace (see LocalBackend: never for untrusted agents on
    a shared host). `config_deps`, a cached install of what OpenCode would npm-install into its config directory at
    start, is mounted there read-only: OpenCode finds it in place and contacts no registry.

    The sandbox's root is always made of the host's files (system_root: its system directories read-only, our
    passwd and group, the runtime paths our programs need); the holder, our launchers and OpenCode run there. With
    `image_root` (the rollout's writable view of an image), the image is the task's root at TASK_ROOT, with the
    rollout's home, /tmp, the grader's directory, /logs, the control directory, and at HOST_MOUNT read-only what of
    the host the task's commands start (`runtime.view`); its top-level directories not in OUR_TOP_LEVEL are bound
    at their own names in the sandbox's root too, for OpenCode's file tools."""
    root = system_root()
    users = ["--ro-bind", str(layout.control / "passwd"), "/etc/passwd"]
    users += ["--ro-bind", str(layout.control / "group"), "/etc/group"]
    host = runtime_binds(runtime_paths)
    ours = {path.strip("/").split("/")[0] for path in runtime_paths if not _under(path, SYSTEM_DIRS)}
    task = [] if image_root is None else [*_image_entries(image_root, ours), *_task_root(layout, image_root, runtime)]
    return [
        "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        *([] if share_host_network else ["--unshare-net"]),
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--cap-add",
        "CAP_SYS_ADMIN",
        *root,
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
        *users,
        *host,
        *task,
        "--chdir",
        "/",
        "--",
        "/bin/sh",
        "-c",
        holder_script(image_root is not None, own_network=not share_host_network),
    ]


TASK_MOUNT_POINTS = ("home/user", "tmp", "home/grader", "logs", "etc/hosts", "dev", "proc", "run")
"""Where the holder mounts into the task's root: each must be a real directory (a file for etc/hosts) of the image,
never a link, or a bind would land where the link points (a relative link can lead out of TASK_ROOT)."""


def _task_root(layout: Layout, image_root: Path, runtime: HostRuntime) -> list[str]:
    argv = ["--bind", str(image_root), TASK_ROOT, "--dev", f"{TASK_ROOT}/dev"]
    argv += ["--bind", str(layout.home), f"{TASK_ROOT}/home/user", "--bind", str(layout.tmp), f"{TASK_ROOT}/tmp"]
    argv += ["--bind", str(layout.grader_dir), f"{TASK_ROOT}{GRADER_DIR}"]
    argv += ["--bind", str(layout.task_hosts), f"{TASK_ROOT}/etc/hosts"]
    argv += ["--bind", str(layout.home / os.path.relpath(LOGS_DIR, "/home/user")), f"{TASK_ROOT}{HARBOR_LOGS}"]
    argv += ["--ro-bind", str(layout.control), TASK_ROOT + CONTROL_MOUNT]
    host = TASK_ROOT + HOST_MOUNT
    argv += ["--tmpfs", host]
    for path in runtime.view:
        argv += ["--ro-bind", path, host + path]
    for directory in _ancestors(runtime.view):
        argv += ["--chmod", "0755", host + directory]
    return [*argv, "--remount-ro", host]


def _image_entries(image_root: Path, ours: set[str]) -> list[str]:
    """The image's top-level directories outside OUR_TOP_LEVEL and `ours` (where our runtime paths are bound, e.g.
    a virtualenv in /opt), bound at their names in the sandbox's root (a link is made as a link there, resolved in
    the sandbox's root; anything else is left out)."""
    argv: list[str] = []
    for entry in sorted(os.scandir(image_root), key=lambda entry: entry.name):
        if entry.name in OUR_TOP_LEVEL or entry.name in ours:
            continue
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry.path), f"/{entry.name}"]
        elif entry.is_dir(follow_symlinks=False):
            argv += ["--bind", entry.path, f"/{entry.name}"]
    return argv


def _ancestors(paths: Sequence[str]) -> list[str]:
    """The directories above `paths` (bubblewrap makes them 0700 where it creates them), parents first."""
    above = {str(parent) for path in paths for parent in Path(path).parents if str(parent) != "/"}
    return sorted(above, key=lambda directory: (directory.count("/"), directory))


def _config_deps_binds(config_deps: str | None) -> list[str]:
    if config_deps is None:
        return []
    binds: list[str] = []
    for name in ("node_modules", "package.json", "package-lock.json"):
        binds += ["--ro-bind", f"{config_deps}/{name}", f"{AGENT_CONFIG_DIR}/{name}"]
    # bubblewrap makes the directories leading to the binds 0700 (root's): OpenCode must be able to cross them
    for directory in (os.path.dirname(AGENT_CONFIG_DIR), AGENT_CONFIG_DIR):
        binds += ["--chmod", "0755", directory]
    return binds


def proxy_argv(layout: Layout, ids: HostIds, runtime_paths: Sequence[str], program: Sequence[str]) -> list[str]:
    """The capture proxy's compartment: outside the sandbox's namespaces (the host network, to reach the model),
    its own PID namespace, the host's system directories read-only and of the rest only its runtime paths, its
    private directories writable (nothing of the sandbox's tree), the rollout's second unprivileged uid, no
    capabilities. Wherever the host keeps those paths, the directories leading to them are the compartment's own."""
    private = str(layout.private)
    return [
        "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        *_system_dirs(),
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        *_runtime_binds(runtime_paths, _outside_system, writable=[private, str(layout.sockets)]),
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
