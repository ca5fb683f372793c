"""OpenCode's environment on a cloud VM, from an allow-list, and its tools' shell, which gives the tools the task's.

On E2B and Hugging Face the VM is the boundary: OpenCode and its tools run as the same `user`, in the VM's own
system (the template, or an image the caller named), so what the VM's shell and programs are is the VM's. What we
do decide is OpenCode's environment: the provider's command runner hands a command the VM's environment (a
template's ENV, the sandbox's envs) and ours merged, so OpenCode's command first unsets every variable not on
OPENCODE_ALLOWED or given as OpenCode's own (OPENCODE_*: its config, its key, its switches). A caller's `env` goes
to the tools alone, through SHELL: a root-written script that sets it and starts bash.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping

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


def tool_shell(env_file: str, opencode_names: Iterable[str]) -> str:
    """The tools' shell (SHELL): OpenCode's own names unset, the task's environment exported, then bash."""
    unset = " ".join(sorted(set(opencode_names)))
    return f'#!/bin/sh\nunset {unset}\nset -a\n. {shlex.quote(env_file)}\nset +a\nexec bash "$@"\n'


def env_file_text(env: Mapping[str, str]) -> str:
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in env.items())
