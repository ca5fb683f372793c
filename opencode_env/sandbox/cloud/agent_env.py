"""OpenCode's identity and environment on a cloud VM, and its tools' shell.

On E2B and Hugging Face the VM is the boundary and root is ours. OpenCode runs as a uid of its own (OPENCODE_UID,
in the task user's group, no capability), with a HOME, config, data and state only it can open, so no task identity
can read its environment (the proxy token), trace it, or plant what it loads; the capture proxy admits only sockets
that uid (or root) owns. Its tools' shell asks a root broker (tool_broker.py) to start each command as `user`, with
the task's environment. OpenCode's own environment is from an allow-list: the provider's command runner hands a
command the VM's environment (a template's ENV, the sandbox's envs) and ours merged, so OpenCode's command first
unsets every variable not on OPENCODE_ALLOWED, not its private dirs', and not its own (OPENCODE_*: its config, its
key, its switches). A caller's `env` goes to the tools alone, through the broker.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from opencode_env import inside

AGENT_ENV_PREFIX = "OPENCODE_"
OPENCODE_ALLOWED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR", "SHELL")
"""What OpenCode keeps of the environment its command starts with, besides its own OPENCODE_* names."""


def allow_listed(cmd: str, allowed: Iterable[str]) -> str:
    """`cmd`, run once every exported variable not named in `allowed` is unset (values never reach argv)."""
    names = " ".join(sorted(set(allowed)))
    scan = "env | sed -n 's/^\\([A-Za-z_][A-Za-z0-9_]*\\)=.*/\\1/p'"
    drop = 'unset "$name" 2>/dev/null || :'
    return f'for name in $({scan}); do case " {names} " in *" $name "*) ;; *) {drop} ;; esac; done; {cmd}'


def split_agent_env(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """OpenCode's own names (OPENCODE_*), and the rest, which are its tools'."""
    own = {name: value for name, value in env.items() if name.startswith(AGENT_ENV_PREFIX)}
    tools = {name: value for name, value in env.items() if not name.startswith(AGENT_ENV_PREFIX)}
    return own, tools


TRUSTED_PATH = (
    '_ok() { [ -n "$(find -L "$1" -maxdepth 0 -type d ! -perm /022 \\( -uid 0 -o -uid 65534 \\) '
    '2>/dev/null)" ]; }; '
    '_all() { x=$1; while [ -n "$x" ]; do _ok "$x" || return 1; x=${x%/*}; done; }; '
    "_p=$PATH; PATH=/usr/sbin:/usr/bin:/sbin:/bin; "
    "_t=; _IFS=$IFS; IFS=:; for _d in $_p; do IFS=$_IFS; case $_d in /*) "
    '_all "$_d" && _all "$(readlink -f "$_d")" && _t=${_t:+$_t:}$_d;; esac; done; IFS=$_IFS; '
    "export PATH=$_t; "
)
"""Shell that keeps of PATH only the directories no task identity can change: each component of the path as
written and as resolved a directory of root's (or of the overflow uid, which no identity of the VM has: the fakes'
host files) that neither its group nor others may write. What OpenCode or root resolves by name (git, rg, python3,
setpriv) then comes from the VM's system, never from a directory such as ~/.npm-global/bin."""

OPENCODE_DIR_LAST = (
    '_oc=$(PATH=$_p command -v opencode 2>/dev/null) && case ":$PATH:" in *":${_oc%/*}:"*) ;; '
    '*) export PATH="$PATH:${_oc%/*}";; esac; '
)
"""After TRUSTED_PATH, OpenCode's: where OpenCode itself was found on the VM's PATH, last, so a name the system has
is still the system's. (An OpenCode the task's user installed, on a template without it, is that user's program:
docs/security.md says so.)"""

OPENCODE_UID = 1002
"""OpenCode's own uid on a cloud VM (`user` is 1000, the grader 1001): no task identity has it, so none can read its
environment (the proxy token), trace it, signal it or open a socket the proxy takes for OpenCode's."""


@dataclass(frozen=True)
class AgentRoot:
    """What root makes for OpenCode before it starts, under a random name in /tmp (root's, sticky): `home` (0700,
    OpenCode's: its HOME, config, data, state and cache), `run` (0700, OpenCode's: the tools' broker socket),
    `control` (root's, read-only to the rest: the config and instruction) and the broker and tools' shell (root's)."""

    path: str

    @property
    def home(self) -> str:
        return f"{self.path}/home"

    @property
    def socket(self) -> str:
        return f"{self.path}/run/tools.sock"

    @property
    def control(self) -> str:
        return f"{self.path}/control"

    @property
    def broker(self) -> str:
        return f"{self.path}/tool_broker.py"

    @property
    def broker_config(self) -> str:
        return f"{self.path}/broker.json"

    @property
    def shell(self) -> str:
        """Named bash: OpenCode's bash tool takes SHELL only when it is a shell it knows."""
        return f"{self.path}/bash"

    def opencode_env(self) -> dict[str, str]:
        return {
            "HOME": self.home,
            "XDG_CONFIG_HOME": f"{self.home}/config",
            "XDG_DATA_HOME": f"{self.home}/data",
            "XDG_STATE_HOME": f"{self.home}/state",
            "XDG_CACHE_HOME": f"{self.home}/cache",
            "SHELL": self.shell,
        }

    def make_script(self, user: str) -> str:
        """Run as root: the directories, owned as the class says; prints the python3 the broker runs with. Fails
        when the name exists (a task cannot have made it for us)."""
        home, run = shlex.quote(self.home), shlex.quote(f"{self.path}/run")
        return (
            f"set -e; mkdir -m 711 {shlex.quote(self.path)}; mkdir -m 700 {home} {run}; "
            f"mkdir -m 755 {shlex.quote(self.control)}; "
            f'chown {OPENCODE_UID}:"$(id -g {shlex.quote(user)})" {home} {run}; {TRUSTED_PATH}command -v python3'
        )

    def tool_shell(self, python: str) -> str:
        words = shlex.join([python, "-I", "-S", self.broker, "client", self.socket])
        return f'#!/bin/sh\nexec {words} "$@"\n'

    def broker_command(self, python: str) -> str:
        words = shlex.join([python, "-I", "-S", self.broker, "serve", self.socket, self.broker_config])
        return f"exec {words} >> {shlex.quote(self.path + '/broker.log')} 2>&1"

    def broker_config_text(self, *, user: str, home: str, task_env: Mapping[str, str]) -> str:
        config = {"allowed_uid": OPENCODE_UID, "user": user, "home": home, "task_env": dict(task_env)}
        return json.dumps(config)

    def launch(self, cmd: str, own_names: Iterable[str], user: str) -> str:
        """OpenCode's command as root sends it: its environment allow-listed, then its own uid in the task user's
        group, no capability, no new privileges, umask 002 (the user edits what OpenCode writes, and the reverse)."""
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in self.opencode_env().items())
        drop = (
            f'exec setpriv --reuid={OPENCODE_UID} --regid="$(id -g {shlex.quote(user)})" --clear-groups '
            f"--inh-caps=-all --no-new-privs -- /bin/bash -c {shlex.quote(f'umask 002 && {cmd}')}"
        )
        allowed = [*OPENCODE_ALLOWED, *self.opencode_env(), *own_names]
        return allow_listed(f"{TRUSTED_PATH}{OPENCODE_DIR_LAST}export {exports}; {drop}", allowed)


def tool_broker_source() -> str:
    return (Path(inside.__file__).parent / "tool_broker.py").read_text(encoding="utf-8")
