"""How a command enters a local sandbox as each of its identities (argv builders, pure).

Every command enters the holder's namespaces (nsenter, see bubblewrap.py), drops to the rollout's own unprivileged
host uid (setpriv) and runs as uid 1000 in a user namespace of its own (unshare), so no process of the sandbox holds
a capability over any host resource; the other identities go through userns.py, which maps several uids. Agent and
verify commands also get a PID namespace of their own, so killing a command ends everything it started; setup
commands run in the holder's, so services they leave in the background live until the sandbox closes.

Every program of ours in that chain (nsenter, setpriv, unshare, userns.py, the small init, the tools' shell,
seccomp_exec.py) and OpenCode run from the host's files in the sandbox's own root, with an environment of ours
(PATH only); the command's environment travels to its last step in a memfd. That step, seccomp_exec.py, enters the
task's root (an image's, at TASK_ROOT), becomes the command's identity, loads the syscall filter and execs the
command with its environment: nothing the task supplied is read or run before it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from opencode_env.sandbox.base import Identity
from opencode_env.sandbox.local.isolation.bubblewrap import (
    AGENT_SYSCALL_FILTER,
    CONTROL_MOUNT,
    SECCOMP_EXEC,
    SYSCALL_FILTER,
    TASK_ROOT,
)
from opencode_env.sandbox.local.isolation.host_ids import GRADER_UID, IMAGE_UIDS, SANDBOX_UID, HostIds
from opencode_env.sandbox.local.isolation.host_runtime import HOST_ROOT, HostRuntime

AGENT_CAPS = "+setuid,+setgid,+dac_override,+kill,+sys_chroot"
"""What OpenCode keeps, inside its own user namespace only: switching its tools' shell to `user` in the task's root,
reading and writing the files of the sandbox's two identities (its own and `user`'s), as the agent's edit tools
must, and stopping a tool command that ran past its timeout."""
TOOL_SHELL = f"{CONTROL_MOUNT}/shell/bash"
TOOL_ENV = f"{CONTROL_MOUNT}/tool-env"
"""The environment of the agent's tools' commands (the task's: its image's ENV, the request's `env`), written by
the host before OpenCode starts; OpenCode's own environment never reaches them."""
AGENT_UMASK = "002"
CAP_SYS_PTRACE = 19
"""Dropped from the sandbox's root's commands: its own init and launchers (our root's view, through /proc/1/root)
hold every capability of the command's namespace, so without it root could trace them or enter their root; it
still traces its own children, whose capabilities are its own."""


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
    env_fd: int,
    tmp_mb: int = 1024,
    runtime: HostRuntime = HOST_ROOT,
    roles: Roles = Roles(),
) -> list[str]:
    """Enter the holder's namespaces, then run `cmd` as `identity` (see Identity) with no capability over any host
    resource: `user` through setpriv + unshare (one mapped uid); `root`, `agent` and `grader` through userns.py,
    whose maps (several uids) this still-privileged process writes. The sandbox's root maps every in-sandbox uid
    (IMAGE_UIDS of them, `user` and `grader` among them), so it can hand files between them and own an image's
    files as a VM's root would; OpenCode's namespace maps only itself and `user`; the grader's only itself (and the
    root that mounts its fresh /tmp before the last step drops to it). `env_fd` (inherited) holds the command's
    environment. With an image (`runtime` not HOST_ROOT) the task's commands run in TASK_ROOT with the host's bash
    started through `runtime`; OpenCode runs in the sandbox's root, which is the host's files."""
    task_root = runtime is not HOST_ROOT
    enter = ["nsenter", f"--target={holder_pid}", "--mount", "--pid", "--net", "--ipc", "--uts", "--root"]
    enter += [f"--wdns={cwd}", "--"]
    proc = f"--mount-proc={TASK_ROOT}/proc" if task_root and identity != "agent" else "--mount-proc"
    pid_namespace = ["--pid", "--fork", "--mount", proc, "--kill-child"] if own_pid_namespace else []
    task_proc = task_root and identity == "agent" and own_pid_namespace
    init = _init(f"mount -t proc proc {TASK_ROOT}/proc" if task_proc else "") if own_pid_namespace else []
    last = _Last(helpers, ("--env-fd", str(env_fd)), task_root)
    shell = [*runtime.program("/bin/bash"), "-c", cmd]
    if identity == "agent":
        mapped = _userns(helpers, [(0, ids.agent, 1), (SANDBOX_UID, ids.user, 1)], gid=SANDBOX_UID)
        opencode = [*last.argv(filters=(AGENT_SYSCALL_FILTER,), root=False), "/bin/bash", "-c", cmd]
        return [*enter, *mapped, "unshare", *pid_namespace, "--", *init, *_agent(opencode)]
    everyone = [(0, ids.root, IMAGE_UIDS)]
    if identity == "grader" and roles.grader_is_root:
        mapped = _userns(helpers, everyone, gid=0)
        fresh = _fresh_tmp(tmp_mb, task_root)
        grader = last.argv(drop_ptrace=True)
        return [*enter, *mapped, "unshare", *pid_namespace, "--", *init, *fresh, *grader, *shell]
    if identity == "grader":
        mapped = _userns(helpers, [(0, ids.root, 1), (GRADER_UID, ids.grader, 1)], gid=0)
        fresh = _fresh_tmp(tmp_mb, task_root)
        grader = last.argv(uid=GRADER_UID)
        return [*enter, *mapped, "unshare", *pid_namespace, "--", *init, *fresh, *grader, *shell]
    if identity == "root":
        mapped = _userns(helpers, everyone, gid=0)
        return [*enter, *mapped, "unshare", *pid_namespace, "--", *init, *last.argv(drop_ptrace=True), *shell]
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
        # the namespace's capabilities, kept (ambient) only until the last step has entered the task's root
        "--keep-caps",
        *pid_namespace,
        "--",
        *init,
        *last.argv(drop_caps=True),
        *shell,
    ]


@dataclass(frozen=True)
class _Last:
    """seccomp_exec.py's argv: the last step of a command (see its docstring)."""

    helpers: Helpers
    environment: tuple[str, str]
    """Where the command's environment is read: ("--env-fd", N) or ("--env-file", PATH)."""
    task_root: bool

    def argv(
        self,
        *,
        uid: int | None = None,
        drop_caps: bool = False,
        drop_ptrace: bool = False,
        filters: tuple[str, ...] = (SYSCALL_FILTER,),
        root: bool = True,
    ) -> list[str]:
        argv = [self.helpers.python, "-I", "-S", f"{CONTROL_MOUNT}/{SECCOMP_EXEC}", *self.environment]
        if root and self.task_root:
            argv += ["--root", TASK_ROOT]
        if uid is not None:
            argv += ["--uid", str(uid), "--gid", str(uid)]
        if drop_ptrace:
            argv += ["--drop-cap", str(CAP_SYS_PTRACE)]
        if drop_caps:
            argv.append("--drop-caps")
        return [*argv, *(f"{CONTROL_MOUNT}/{name}" for name in filters), "--"]


def _init(first: str) -> list[str]:
    """Pid 1 of a namespace ignores signals from inside it: a small init keeps the command itself killable from
    within (the agent's own tools), reaps orphans and passes the command's exit status on. `first` runs before."""
    run = '"$@" & wait $!'
    return ["/bin/sh", "-c", f"{first} && {{ {run}; }}" if first else run, "init"]


def _userns(helpers: Helpers, ranges: list[tuple[int, int, int]], *, gid: int) -> list[str]:
    maps = [f"--map={inside}:{outside}:{count}" for inside, outside, count in ranges]
    return [helpers.python, "-I", "-S", helpers.userns, *maps, f"--gid={gid}", "--"]


def _agent(command: list[str]) -> list[str]:
    """OpenCode as its namespace's root, holding only AGENT_CAPS; the umask lets its tools change what it writes."""
    caps = f"-all,{AGENT_CAPS}"
    keep = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--no-new-privs", "--"]
    return ["/bin/sh", "-c", f'umask {AGENT_UMASK} && exec "$@"', "agent", *keep, *command]


def _fresh_tmp(tmp_mb: int, task_root: bool) -> list[str]:
    """A fresh /tmp for the grader (the task root's, in an image), mounted while still root of the namespace; the
    last step then drops to the grader's uid (nothing when the grader is the sandbox's root). The grader's HOME,
    made empty by the host before verify, is in its own directory, which the agent could not enter."""
    tmp = f"{TASK_ROOT}/tmp" if task_root else "/tmp"
    fresh = f'mount -t tmpfs -o mode=1777,nosuid,nodev,size={tmp_mb}m verify-tmp {tmp} && exec "$@"'
    return ["/bin/sh", "-c", fresh, "grader"]


def tool_shell_script(helpers: Helpers, *, task_root: HostRuntime | None) -> str:
    """The shell OpenCode starts its tools with (named bash, given as SHELL), read by the host's /bin/sh in the
    sandbox's root: the tools' commands run as `user`, in the task's root (with an image), under the task's syscall
    filter, with the task's environment (TOOL_ENV), none of OpenCode's (its key), then the real bash starts."""
    runtime = task_root or HOST_ROOT
    last = _Last(helpers, ("--env-file", TOOL_ENV), task_root is not None).argv(uid=SANDBOX_UID)
    words = " ".join(shlex.quote(word) for word in [*last, *runtime.program("/bin/bash")])
    return f'#!/bin/sh\numask 022\nexec {words} "$@"\n'
