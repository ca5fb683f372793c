"""A local rollout's tree on the host: made (a size-bounded file system when loop devices exist), owned by the
rollout's uids, removed without recursion, and reaped when the server that owned it is gone."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from opencode_env.sandbox.base import AGENT_LOG_DIR, OPENCODE_CONFIG_DIR, PRIVATE_ENV_PREFIX, VERIFIER_DIR, WORKDIR
from opencode_env.sandbox.local import hostfs
from opencode_env.sandbox.local.cgroup import Cgroup, detect
from opencode_env.sandbox.local.isolation import (
    AGENT_ONLY_ENV,
    CONTROL_MOUNT,
    GROUP,
    PASSWD,
    TOOL_SHELL,
    HostIds,
    Layout,
    tool_shell_script,
)

log = logging.getLogger("opencode_env.local")
PREFIX = "opencode-env-"
OWNER_LOCK = "owner.lock"


class OwnerLock:
    """Held by the server for a rollout's life: a tree whose lock nobody holds belongs to a server that is gone."""

    def __init__(self, layout: Layout) -> None:
        """Locked under a private name, then renamed into place: a reaper never sees it unlocked."""
        staging = layout.root / f".{OWNER_LOCK}"
        self._handle = staging.open("a")
        fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        staging.rename(layout.root / OWNER_LOCK)

    def release(self) -> None:
        self._handle.close()


def make_layout(base_dir: Path | None, disk_mb: int) -> tuple[Layout, OwnerLock]:
    """The rollout's tree, owned (locked) from its first moment, so a reaper never takes it for an orphan."""
    root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base_dir))
    root.chmod(0o711)
    layout = Layout(root)
    lock = OwnerLock(layout)
    layout.fs.mkdir()
    _mount_disk(layout, disk_mb)
    for directory in (layout.control, layout.private):
        directory.mkdir()
    (layout.control / "passwd").write_text(PASSWD)
    (layout.control / "group").write_text(GROUP)
    shell = layout.control / os.path.relpath(TOOL_SHELL, CONTROL_MOUNT)
    shell.parent.mkdir()
    shell.write_text(tool_shell_script(PRIVATE_ENV_PREFIX, tuple(AGENT_ONLY_ENV)))
    shell.chmod(0o755)
    return layout, lock


def _mount_disk(layout: Layout, disk_mb: int) -> None:
    """The rollout's writable tree on a file system of its own, so its size is bounded (and removal is one
    unmount); without loop devices the tree stays on the host's file system, unbounded, and the result says so.
    1% of it is kept for the host's root: an agent that fills its disk still gets verify's protected files
    written in and its verifier directory made (then verify fails for want of space: the agent's doing)."""
    if shutil.which("mkfs.ext4") is None or not Path("/dev/loop-control").exists():
        return
    with layout.disk_image.open("wb") as image:
        image.truncate(disk_mb * 2**20)
    made = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-m", "1", "-O", "^has_journal", "-E", "lazy_itable_init=1", str(layout.disk_image)],
        capture_output=True,
        check=False,
    )
    mounted = made.returncode == 0 and (
        subprocess.run(
            ["mount", "-o", "loop,nosuid,nodev", str(layout.disk_image), str(layout.fs)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if not mounted:
        log.warning("no size-bounded file system for %s: %s", layout.root, made.stderr.decode(errors="replace"))
        layout.disk_image.unlink(missing_ok=True)
        return
    shutil.rmtree(layout.fs / "lost+found", ignore_errors=True)


def own_tree(layout: Layout, ids: HostIds) -> None:
    user, root = ids.user, ids.root
    for sub in (WORKDIR, VERIFIER_DIR, AGENT_LOG_DIR, OPENCODE_CONFIG_DIR):
        hostfs.make_dirs(layout.fs, sub.lstrip("/"), owner=(user, user))
    layout.agent_home.mkdir(mode=0o700)
    os.chown(layout.agent_home, ids.agent, user)
    layout.grader_dir.mkdir(mode=0o700)
    os.chown(layout.grader_dir, ids.grader, ids.grader)
    hostfs.make_dirs(layout.fs, "tmp", owner=(user, user))
    (layout.tmp).chmod(0o1777)
    layout.sockets.mkdir(parents=True, mode=0o700)
    for private in (layout.private, layout.sockets):
        os.chown(private, root, root)
        private.chmod(0o700)


def remove_rollout(layout: Layout) -> None:
    if layout.disk_image.exists():
        subprocess.run(["umount", "--lazy", str(layout.fs)], capture_output=True, check=False)
        layout.disk_image.unlink(missing_ok=True)
    hostfs.remove_tree(layout.sockets)
    hostfs.remove_tree(layout.root)


def reap_orphans(base_dir: Path | None) -> list[str]:
    """Remove the trees (and cgroups, mounts) of rollouts whose server died; live servers' trees are untouched."""
    base = base_dir or Path(tempfile.gettempdir())
    reaped = []
    for root in sorted(base.glob(f"{PREFIX}*")):
        lock_path = root / OWNER_LOCK
        if not lock_path.is_file() or lock_path.is_symlink():
            continue
        with lock_path.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            version = detect()
            if version is not None:
                Cgroup(root.name, version).destroy()
            remove_rollout(Layout(root))
        reaped.append(root.name)
        log.warning("reaped %s, left by a server that is gone", root)
    return reaped
