"""How a command enters a local sandbox as each of its identities (argv builders, pure).

Every command enters the holder's namespaces (nsenter, see isolation.py), drops to the rollout's own unprivileged
host uid (setpriv) and runs as uid 1000 in a user namespace of its own (unshare), so no process of the sandbox holds
a capability over any host resource; the other identities go through userns.py, which maps several uids. Agent and
verify commands also get a PID namespace of their own, so killing a command ends everything it started; setup
commands run in the holder's, so services they leave in the background live until the sandbox closes.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from opencode_env.sandbox.base import Identity
from opencode_env.sandbox.local.host_ids import GRADER_UID, IMAGE_UIDS, SANDBOX_UID, HostIds
from opencode_env.sandbox.local.host_runtime import HOST_ROOT, HostRuntime
from opencode_env.sandbox.local.isolation import CONTROL_MOUNT, SECCOMP_EXEC, SYSCALL_FILTER

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
