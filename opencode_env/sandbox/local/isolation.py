"""The local backend's process model, as argv builders (pure) plus the host uids a rollout runs as.

One long-lived holder per rollout (bubblewrap, started as root) owns the rollout's mount, PID, network, IPC and
UTS namespaces: an image's tree as its root (or, for image "host", the host's system directories read-only and
nothing else of the host: SYSTEM_DIRS), the rollout's own tree mounted at /home/user and /tmp, loopback as its only
network. Every command enters those namespaces (nsenter), drops to the rollout's own unprivileged host uid
(setpriv) and runs as uid 1000 in a user namespace of its own (unshare), so no process of the sandbox holds a
capability over any host resource. Agent and verify commands also get a PID namespace of their own, so killing a
command ends everything it started; setup commands run in the holder's, so services they leave in the background
live until the sandbox closes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opencode_env.sandbox.base import LOGS_DIR, OPENCODE_CONFIG_DIR, Identity
from opencode_env.sandbox.local.host_runtime import HOST_MOUNT, HOST_ROOT, HostRuntime

SANDBOX_UID = 1000
GRADER_UID = 1001
UID_BASE = 2_000_000_000
UIDS_PER_SLOT = 1 << 17
UID_SLOTS = 16_384
IMAGE_UIDS = 1 << 16
"""In-sandbox uids 0..65535 are the host uids `root`..`root + 65535` of the rollout: an image's files, owned by any
of them, keep their owners inside (its root's are the sandbox root's), and none is any other rollout's."""
UID_REGISTRY = Path("/run/opencode-env/uids")
SOCKETS_DIR = Path("/run/opencode-env/proxies")
SYSCALL_FILTER = "syscalls.bpf"
SECCOMP_EXEC = "seccomp_exec.py"
"""The syscall filter (syscall_filter.py), in the control directory: every command is started under it."""
HIDDEN_ROOTS = ("/home", "/tmp", "/run", "/var/tmp", "/root", "/srv", "/mnt", "/media")
"""Our own compartments on the host's root (the capture proxy) see it read-only without these."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""All a sandbox on the host's own system (image "host") sees of the host, read-only: its programs, libraries and
their configuration. The operator's files (checkouts and their results, homes, /opt, /srv, /var, data directories
anywhere) are not there at all; the runtime paths our programs need are bound one by one."""
EMPTY_DIRS = ("/tmp", "/var/tmp", "/run", "/home", "/root")
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
HARBOR_LOGS = "/logs"
"""Where Harbor's tests write (/logs/verifier/reward.txt): in an image, the rollout's own logs directory."""
HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 sandbox\n"


def holder_script(runtime: HostRuntime) -> str:
    return f"{runtime.words('mount')} -t proc proc /proc && echo ready && exec {runtime.words('sleep')} infinity"


@dataclass(frozen=True)
class HostIds:
    """The unprivileged host uids of one rollout: its in-sandbox root (also the proxy's), whose block of IMAGE_UIDS
    holds every in-sandbox uid (`user` is root + 1000, the grader root + 1001), and OpenCode, outside that block."""

    root: int

    @classmethod
    def of_slot(cls, slot: int) -> HostIds:
        return cls(root=UID_BASE + UIDS_PER_SLOT * slot)

    @property
    def user(self) -> int:
        return self.root + SANDBOX_UID

    @property
    def grader(self) -> int:
        return self.root + GRADER_UID

    @property
    def agent(self) -> int:
        return self.root + IMAGE_UIDS

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
            self.ids = HostIds.of_slot(slot)
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


def _hidden_roots() -> tuple[str, ...]:
    return (*HIDDEN_ROOTS, _host_home())


def _outside_system(path: str) -> bool:
    return not _under(path, SYSTEM_DIRS)


def _inside_hidden_roots(path: str) -> bool:
    return _under(path, _hidden_roots())


def _runtime_binds(paths: Sequence[str], hidden: Callable[[str], bool], writable: Sequence[str] = ()) -> list[str]:
    """Bind the runtime paths that `hidden` says the root does not show. bubblewrap creates the directories leading
    to them with their host modes (a 0700 CI checkout or /root), which the sandbox's uid could not cross: those
    directories exist only in the sandbox's own tmpfs, so they are opened up there (never a host directory)."""
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


def _host_home() -> str:
    home = os.path.expanduser("~")
    return home if home not in ("", "/") else "/nonexistent"


def _hidden_tmpfs() -> list[str]:
    argv: list[str] = []
    for root in sorted(set(_hidden_roots())):
        if os.path.isdir(root) and not any(root.startswith(other + "/") for other in HIDDEN_ROOTS):
            argv += ["--tmpfs", root]
    return argv


def system_root() -> list[str]:
    """The root of a sandbox on the host's own system: SYSTEM_DIRS read-only (a merged-/usr link as a link), empty
    places to write, and nothing else of the host."""
    argv: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--dev", "/dev", "--dir", "/proc"]
    for path in EMPTY_DIRS:
        argv += ["--tmpfs", path]
    return argv


def holder_argv(
    layout: Layout,
    runtime_paths: Sequence[str],
    *,
    own_network: bool = True,
    config_deps: str | None = None,
    image_root: Path | None = None,
    runtime: HostRuntime = HOST_ROOT,
) -> list[str]:
    """The rollout's namespace holder. It keeps CAP_SYS_ADMIN in its namespaces only to mount a /proc of its own
    (bubblewrap's covers parts of /proc, which would stop commands mounting theirs); it then just sleeps.
    `own_network=False` is for test doubles of cloud sandboxes, which have the network of a VM. `config_deps`, a
    cached install of what OpenCode would npm-install into its config directory at start, is mounted there
    read-only: OpenCode finds it in place and contacts no registry. With `image_root` (the rollout's writable view
    of an image), that is the root, HOST_MOUNT shows only what of the host the programs `runtime` starts need (its
    `view`, read-only: an allow-list, nothing of the operator's), and /logs is the rollout's logs directory (Harbor's
    layout)."""
    if image_root is None:
        root = system_root()
        users = ["--ro-bind", str(layout.control / "passwd"), "/etc/passwd"]
        users += ["--ro-bind", str(layout.control / "group"), "/etc/group"]
        host = _runtime_binds(runtime_paths, _outside_system)
    else:
        root = ["--bind", str(image_root), "/", "--dev", "/dev"]
        users = ["--ro-bind", str(layout.control / "hosts"), "/etc/hosts"]
        users += ["--bind", str(layout.home / os.path.relpath(LOGS_DIR, "/home/user")), HARBOR_LOGS]
        host = ["--tmpfs", HOST_MOUNT]
        for path in runtime.view:
            host += ["--ro-bind", path, HOST_MOUNT + path]
        for directory in _ancestors(runtime.view):
            host += ["--chmod", "0755", HOST_MOUNT + directory]
        host += ["--remount-ro", HOST_MOUNT]
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
        "--chdir",
        "/",
        "--",
        *runtime.program("/bin/sh"),
        "-c",
        holder_script(runtime),
    ]


def _ancestors(paths: Sequence[str]) -> list[str]:
    """The directories above `paths` (bubblewrap makes them 0700 where it creates them), parents first."""
    above = {str(parent) for path in paths for parent in Path(path).parents if str(parent) != "/"}
    return sorted(above, key=lambda directory: (directory.count("/"), directory))


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
    """Host programs every sandbox command may start with: a Python (its real path: a virtualenv's link may live
    where a command's fresh /tmp hides it) and the user-namespace starter (userns.py). The syscall filter's loader
    is copied into the control directory (SECCOMP_EXEC), which no mount of a command hides."""

    python: str
    userns: str


@dataclass(frozen=True)
class Roles:
    """What the sandbox's identities are for this rollout: whether the grader is the sandbox's root (Harbor's
    tests install packages) or uid 1001."""

    grader_is_root: bool = False


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
    runtime: HostRuntime = HOST_ROOT,
    roles: Roles = Roles(),
) -> list[str]:
    """Enter the holder's namespaces, then run `cmd` as `identity` (see Identity) with no capability over any host
    resource: `user` through setpriv + unshare (one mapped uid); `root`, `agent` and `grader` through userns.py,
    whose maps (several uids) this still-privileged process writes. The sandbox's root maps every in-sandbox uid
    (IMAGE_UIDS of them, `user` and `grader` among them), so it can hand files between them and own an image's
    files as a VM's root would; OpenCode's namespace maps only itself and `user`; the grader's only itself (and the
    root that mounts its fresh /tmp before dropping to it). The command itself starts under the syscall filter, once
    every namespace and mount of ours is made. Every program is started through `runtime`."""
    run = runtime.program
    enter = ["nsenter", f"--target={holder_pid}", "--mount", "--pid", "--net", "--ipc", "--uts", "--root"]
    enter += [f"--wdns={cwd}", "--"]
    # Pid 1 of a namespace ignores signals from inside it: a small init keeps the command itself killable from
    # within (the agent's own tools), reaps orphans and passes the command's exit status on.
    init = [*run("/bin/sh"), "-c", '"$@" & wait $!', "init"] if own_pid_namespace else []
    filtered = [*run(helpers.python), "-I", "-S", f"{CONTROL_MOUNT}/{SECCOMP_EXEC}"]
    filtered += [f"{CONTROL_MOUNT}/{SYSCALL_FILTER}", "--"]
    command = [*filtered, *init, *run("/bin/bash"), "-c", cmd]
    pid_namespace = ["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"] if own_pid_namespace else []
    unshare = run("unshare")
    if identity == "agent":
        mapped = _userns(helpers, runtime, [(0, ids.agent, 1), (SANDBOX_UID, ids.user, 1)], gid=SANDBOX_UID)
        return [*enter, *mapped, *unshare, *pid_namespace, "--", *_agent(command, runtime)]
    everyone = [(0, ids.root, IMAGE_UIDS)]
    if identity == "grader" and roles.grader_is_root:
        mapped = _userns(helpers, runtime, everyone, gid=0)
        return [*enter, *mapped, *unshare, *pid_namespace, "--", *_fresh_tmp(command, tmp_mb, runtime, [])]
    if identity == "grader":
        mapped = _userns(helpers, runtime, [(0, ids.root, 1), (GRADER_UID, ids.grader, 1)], gid=0)
        drop = _drop_to(GRADER_UID, runtime)
        return [*enter, *mapped, *unshare, *pid_namespace, "--", *_fresh_tmp(command, tmp_mb, runtime, drop)]
    if identity == "root":
        mapped = _userns(helpers, runtime, everyone, gid=0)
        return [*enter, *mapped, *unshare, *pid_namespace, "--", *command]
    return [
        *enter,
        *run("setpriv"),
        f"--reuid={ids.user}",
        f"--regid={ids.user}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        *unshare,
        f"--map-user={SANDBOX_UID}",
        f"--map-group={SANDBOX_UID}",
        *pid_namespace,
        "--",
        *command,
    ]


def _userns(helpers: Helpers, runtime: HostRuntime, ranges: list[tuple[int, int, int]], *, gid: int) -> list[str]:
    maps = [f"--map={inside}:{outside}:{count}" for inside, outside, count in ranges]
    python = [*runtime.program(helpers.python), "-I", "-S", runtime.inside(helpers.userns)]
    return [*python, *maps, f"--gid={gid}", "--"]


def _drop_to(uid: int, runtime: HostRuntime = HOST_ROOT) -> list[str]:
    return [
        *runtime.program("setpriv"),
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def _agent(command: list[str], runtime: HostRuntime) -> list[str]:
    """OpenCode as its namespace's root, holding only AGENT_CAPS; the umask lets its tools change what it writes."""
    caps = f"-all,{AGENT_CAPS}"
    keep = [*runtime.program("setpriv"), f"--inh-caps={caps}", f"--bounding-set={caps}", "--no-new-privs", "--"]
    return [*runtime.program("/bin/sh"), "-c", f'umask {AGENT_UMASK} && exec "$@"', "agent", *keep, *command]


def _fresh_tmp(command: list[str], tmp_mb: int, runtime: HostRuntime, drop: list[str]) -> list[str]:
    """A fresh /tmp, mounted while still root of the namespace, then `drop` (the grader's uid with no capability at
    all; nothing when the grader is the sandbox's root). The grader's HOME, made empty by the host before verify,
    is in its own directory, which the agent could not enter."""
    mount = runtime.words("mount")
    fresh = f'{mount} -t tmpfs -o mode=1777,nosuid,nodev,size={tmp_mb}m verify-tmp /tmp && exec "$@"'
    return [*runtime.program("/bin/sh"), "-c", fresh, "grader", *drop, *command]


def tool_shell_script(private_prefix: str, agent_vars: Sequence[str], runtime: HostRuntime = HOST_ROOT) -> str:
    """The shell OpenCode starts its tools with (named bash, given as SHELL): the tools run as `user`, without
    OpenCode's private variables (every name starting with `private_prefix`: its key) and directories, before the
    real bash starts. In an image the script is read by the image's /bin/sh and starts the host's programs."""
    names = f"s/^\\({private_prefix}[A-Za-z0-9_]*\\)=.*/\\1/p"
    unset = " ".join(f"-u {name}" for name in agent_vars)
    drop = " ".join(shlex.quote(word) for word in _drop_to(SANDBOX_UID, runtime))
    env, sed, bash = runtime.words("env"), runtime.words("sed"), runtime.words("/bin/bash")
    shell = "/bin/bash" if runtime is HOST_ROOT else "/bin/sh"
    return (
        "#!/bin/sh\numask 022\n"
        f"for name in $({env} | {sed} -n '{names}'); do unset \"$name\"; done\n"
        f'exec {env} {unset} SHELL={shell} {drop} {bash} "$@"\n'
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
        *_runtime_binds(runtime_paths, _inside_hidden_roots, writable=[private, str(layout.sockets)]),
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
