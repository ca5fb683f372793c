"""Where a request may name a sandbox path: inside the task's own roots, by allow-list.

A caller names sandbox paths in `workdir`, the keys of `files` and `verify_files`, and `solution_files`. Each lands
in one of the task's roots: its home (/home/user), its /tmp, or a top-level directory of the task's image (/app,
/tests, /solution, /logs: any top-level name the sandbox's own root does not keep for itself). Nothing else is
reachable, whatever it is called: OpenCode's home and config, the proxy's directory, the control directory and our
helpers live under the sandbox's own top-level names (/home/opencode, /run, /usr...), or, where a backend gives
OpenCode the task's home, in the few directories of it listed in OPENCODE_IN_HOME.
"""

from __future__ import annotations

import posixpath

HOME = "/home/user"
WORKDIR = f"{HOME}/workdir"
LOGS_DIR = f"{HOME}/logs"
TASK_TMP = "/tmp"
OPENCODE_CONFIG_DIR = f"{HOME}/.config/opencode"
AGENT_LOG_DIR = f"{LOGS_DIR}/agent"
ROLLOUT_DIR = f"{HOME}/.rollout"
OPENCODE_DATA_DIR = f"{HOME}/.local/share"
"""OpenCode's XDG_DATA_HOME where the backend gives it no directory of its own (its tools share its identity)."""
OPENCODE_IN_HOME = (
    OPENCODE_CONFIG_DIR,
    f"{OPENCODE_DATA_DIR}/opencode",
    f"{HOME}/.local/state/opencode",
    f"{HOME}/.cache/opencode",
    f"{HOME}/.opencode",
    ROLLOUT_DIR,
    AGENT_LOG_DIR,
)
"""What is OpenCode's or ours in the task's home on a backend whose OpenCode runs there (its config, plugin, data,
state and cache dirs, our control dir, its event log): out of every request's reach."""
SANDBOX_TOP_LEVEL = frozenset(
    {
        "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "proc", "root", "run", "sbin", "sys",
        "tmp", "usr", "var",
    }
)  # fmt: skip
"""Top-level names the sandbox's own root keeps (the host's system directories, our binds, OpenCode's home under
/home): a task's image owns every other top-level directory; of these, only /home/user and /tmp are the task's."""
TASK_ROOTS_TEXT = (
    f"{HOME} (OpenCode's {', '.join(sorted(posixpath.relpath(path, HOME) for path in OPENCODE_IN_HOME))} in it "
    f"aside), {TASK_TMP} or a top-level directory of the task's image other than "
    + ", ".join(f"/{name}" for name in sorted(SANDBOX_TOP_LEVEL))
)


class OutsideTaskRoots(ValueError):
    """A path a request names that is outside every one of the task's roots."""


def normal_path(path: str, workdir: str = WORKDIR) -> str:
    """`path` made absolute (a relative one under `workdir`) with '.', '//' and a trailing '/' folded; a '..'
    component (also after a backslash) is refused rather than resolved."""
    if "\x00" in path:
        raise OutsideTaskRoots(f"path {path[:80]!r} holds a NUL byte")
    if ".." in path.replace("\\", "/").split("/"):
        raise OutsideTaskRoots(f"path {path[:80]!r} has a '..' component")
    absolute = path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
    return "/" + posixpath.normpath(absolute).lstrip("/")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def task_root_of(path: str) -> str | None:
    """The task's root that holds `path` (absolute, normal), or None: /home/user, /tmp or /<top> of the image."""
    if any(_within(path, private) for private in OPENCODE_IN_HOME):
        return None
    for root in (HOME, TASK_TMP):
        if _within(path, root):
            return root
    top = path.split("/")[1]
    return None if top in SANDBOX_TOP_LEVEL or not top else f"/{top}"


def confined_file(path: str, workdir: str = WORKDIR) -> str:
    """Where a task file named `path` goes: its absolute, normal path, strictly inside one of the task's roots."""
    normal = normal_path(path, workdir)
    root = task_root_of(normal)
    if root is None or normal == root:
        raise OutsideTaskRoots(f"path {path[:200]!r} ({normal[:200]}) is not a file in {TASK_ROOTS_TEXT}")
    if _within(normal_path(workdir, "/"), normal):
        raise OutsideTaskRoots(f"path {path[:200]!r} ({normal[:200]}) names the work dir or a directory above it")
    return normal


def confined_dir(path: str) -> str:
    """A work dir a request names: absolute, normal, one of the task's roots or inside one."""
    normal = normal_path(path, "/")
    if task_root_of(normal) is None:
        raise OutsideTaskRoots(f"path {path[:200]!r} ({normal[:200]}) is not in {TASK_ROOTS_TEXT}")
    return normal
