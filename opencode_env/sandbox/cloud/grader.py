"""The grader on the cloud backends (E2B, Hugging Face): a second Linux user the agent never ran as, and the root
script that hands the agent's work over to it before verify.

The script runs as the VM's or container's root, over a tree the agent may have filled with links and odd names, so
it never lets root follow one: a path component that is a link or not a directory is removed (the link itself)
before anything is made there; ownership changes use `chown -h` (the link, not its target); protected files are then
written by the grader, never by root, then made root's and read-only (`seal_script`). Processes the agent left
behind still run as `user`: once the work dir and the verifier directory are the grader's they can no longer
change either.
"""

from __future__ import annotations

import base64
import posixpath
import shlex
from collections.abc import Iterable

from opencode_env.sandbox.base import (
    HANDED_FILE_MODE,
    HOME,
    LOGS_DIR,
    REWARD_FILE_MODE,
    REWARD_FILES,
    VERIFIER_DIR,
    VERIFIER_DIR_MODE,
    WORKDIR,
    sealed_dirs,
    task_path,
)
from opencode_env.sandbox.grader_python import GRADER_PYTHON_DIR, GRADER_PYTHON_FILES

GRADER_USER = "grader"
GRADER_UID = 1001
GRADER_ROOT = "/home/grader"
GRADER_ENV = {
    "HOME": f"{GRADER_ROOT}/home",
    "TMPDIR": f"{GRADER_ROOT}/tmp",
    "USER": GRADER_USER,
    "LOGNAME": GRADER_USER,
    "PYTHONNOUSERSITE": "1",
}

_STARTUP_B64 = {
    name: base64.b64encode(text.encode("utf-8")).decode("ascii") for name, text in GRADER_PYTHON_FILES.items()
}


def _plain_dir(path: str) -> str:
    quoted = shlex.quote(path)
    return f"{{ if [ -L {quoted} ] || {{ [ -e {quoted} ] && [ ! -d {quoted} ]; }}; then rm -f -- {quoted}; fi; }}"


def handoff_script(protected: Iterable[str], workdir: str = WORKDIR) -> str:
    """Root's part of the hand-over; `protected` are paths relative to the work dir or absolute (validated by the
    request)."""
    grader = f"{GRADER_USER}:{GRADER_USER}"
    lines = [
        "set -eu",
        f"if ! id -u {GRADER_USER} >/dev/null 2>&1; then",
        f"  echo '{GRADER_USER}:x:{GRADER_UID}:{GRADER_UID}:{GRADER_USER}:{GRADER_ROOT}:/bin/bash' >> /etc/passwd",
        f"  echo '{GRADER_USER}:x:{GRADER_UID}:' >> /etc/group",
        "fi",
        f"mkdir -p -m 0700 {GRADER_ROOT}",
        f"find {GRADER_ROOT} -mindepth 1 -delete",
        f"mkdir -m 0700 {GRADER_ROOT}/home {GRADER_ROOT}/tmp",
        f"mkdir -m 0755 {GRADER_PYTHON_DIR}",
        *(f"echo {packed} | base64 -d > {GRADER_PYTHON_DIR}/{name}" for name, packed in _STARTUP_B64.items()),
        f"chown -R {grader} {GRADER_ROOT}",
    ]
    # Root owns HOME and the logs directory from here on: a process the agent left behind can no longer rename
    # or replace anything on the paths below while root works on them, nor after.
    lines += [f"chown -h root:root -- {shlex.quote(HOME)}", f"chmod 0755 -- {shlex.quote(HOME)}"]
    for directory in (workdir, LOGS_DIR):
        lines += [_plain_dir(directory), f"mkdir -p -- {shlex.quote(directory)}"]
    lines += [f"chown -h root:root -- {shlex.quote(LOGS_DIR)}", f"chmod 0755 -- {shlex.quote(LOGS_DIR)}"]
    lines += [f"chown -R -h {grader} -- {shlex.quote(workdir)}"]
    # The reward channel (base.REWARD_FILES): root's files in a root's sticky directory, writable by the grader's
    # group alone; made before the directory opens to that group, so nothing else is ever in it.
    verifier, channel = shlex.quote(VERIFIER_DIR), f"root:{GRADER_USER}"
    lines += [f"rm -rf -- {verifier}", f"mkdir -m 0755 -- {verifier}"]
    for reward in map(shlex.quote, REWARD_FILES):
        lines += [f": > {reward}", f"chown {channel} -- {reward}", f"chmod {REWARD_FILE_MODE:o} -- {reward}"]
    lines += [f"chown {channel} -- {verifier}", f"chmod {VERIFIER_DIR_MODE:o} -- {verifier}"]
    for path in protected:
        lines += _clear_path(task_path(path, workdir), grader, workdir)
    return "\n".join(lines) + "\n"


def seal_script(protected: Iterable[str], workdir: str = WORKDIR) -> str:
    """Root's part after the grader wrote the protected files: each the root's and read-only, the directories above
    it that `sealed_dirs` names root's (no process of the grader's or the agent's runs meanwhile, and root never
    follows a link: the files and directories are the grader's fresh ones)."""
    lines = ["set -eu"]
    for path in protected:
        target = task_path(path, workdir)
        for directory in sealed_dirs(target, workdir):
            quoted = shlex.quote(directory)
            lines += [f"chown -h root:root -- {quoted}", f"[ -L {quoted} ] || chmod 0755 -- {quoted}"]
        quoted = shlex.quote(target)
        lines += [f"chown -h root:root -- {quoted}", f"[ -L {quoted} ] || chmod {HANDED_FILE_MODE:o} -- {quoted}"]
    return "\n".join(lines) + "\n"


def _clear_path(target: str, grader: str, workdir: str) -> list[str]:
    """Every directory on the way to `target` (from the work dir or the verifier directory, which the script has
    just made the grader's, or from / for a path outside both) a real directory of the grader's; `target` gone."""
    lines = []
    normal = posixpath.normpath(target)
    inside = [base for base in (workdir.rstrip("/"), VERIFIER_DIR) if normal.startswith(base + "/")]
    base = inside[0] if inside else "/"
    parts = posixpath.relpath(normal, base).split("/")
    for depth in range(1, len(parts)):
        directory = posixpath.join(base, *parts[:depth])
        quoted = shlex.quote(directory)
        lines += [_plain_dir(directory), f"mkdir -p -- {quoted}", f"chown -h {grader} -- {quoted}"]
    lines.append(f"rm -rf -- {shlex.quote(target)}")
    return lines
