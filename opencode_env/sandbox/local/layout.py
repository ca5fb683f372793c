"""A local rollout's tree on the host: made (a size-bounded file system when loop devices exist), owned by the
rollout's uids, removed without recursion, and reaped when the server that owned it is gone."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opencode_env.inside import source
from opencode_env.sandbox.base import (
    AGENT_LOG_DIR,
    HOME,
    OPENCODE_CONFIG_DIR,
    VERIFIER_DIR,
    WORKDIR,
    SandboxError,
    proxy_file_bytes,
)
from opencode_env.sandbox.file_lock import try_lock
from opencode_env.sandbox.local.files import bounded_fs, hostfs_write
from opencode_env.sandbox.local.isolation.bubblewrap import (
    AGENT_SYSCALL_FILTER,
    AGENT_TMP,
    CONTROL_MOUNT,
    GROUP,
    HOSTS,
    MANAGED_CONFIG_DIR,
    PASSWD,
    SECCOMP_EXEC,
    SYSCALL_FILTER,
    TASK_MOUNT_POINTS,
    USERNS,
    Layout,
)
from opencode_env.sandbox.local.isolation.cgroup import Cgroup, ServicesFreezer, detect, proxy_cgroup_name
from opencode_env.sandbox.local.isolation.command_argv import TOOL_ENV, TOOL_SHELL, Helpers, tool_shell_script
from opencode_env.sandbox.local.isolation.host_ids import IMAGE_UIDS, HostIds, UidLease
from opencode_env.sandbox.local.isolation.host_runtime import HOST_MOUNT, HostRuntime
from opencode_env.sandbox.local.isolation.idmap import mount_idmapped
from opencode_env.sandbox.local.isolation.syscall_filter import filter_program

log = logging.getLogger("opencode_env.local")
PREFIX = "opencode-env-"
IMAGE_MOUNT_POINTS = ("proc", "dev", "etc", "run", "tmp", "logs", "home/user", "home/grader")
"""Made in an image that lacks them, the sandbox root's and open to all (bubblewrap would make them 0700)."""
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


def make_layout(
    base_dir: Path | None, disk_mb: int, helpers: Helpers, runtime: HostRuntime | None = None
) -> tuple[Layout, OwnerLock]:
    """The rollout's tree, owned (locked) from its first moment, so a reaper never takes it for an orphan. The
    control directory (read-only in the sandbox) holds what our launchers read: the syscall filters and their
    loader, passwd and group, the tools' shell, an empty managed config dir for OpenCode."""
    root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base_dir))
    root.chmod(0o711)
    layout = Layout(root)
    lock = OwnerLock(layout)
    layout.fs.mkdir()
    _mount_disk(layout, disk_mb)
    for directory in (layout.control, layout.private):
        directory.mkdir()
    (layout.control / SYSCALL_FILTER).write_bytes(filter_program(task=True))
    (layout.control / AGENT_SYSCALL_FILTER).write_bytes(filter_program(task=False))
    (layout.control / SECCOMP_EXEC).write_text(source(SECCOMP_EXEC))
    (layout.control / USERNS).write_text(source(USERNS))
    (layout.control / "passwd").write_text(PASSWD)
    (layout.control / "group").write_text(GROUP)
    (layout.control / os.path.relpath(MANAGED_CONFIG_DIR, CONTROL_MOUNT)).mkdir()
    (layout.control / os.path.relpath(TOOL_ENV, CONTROL_MOUNT)).write_bytes(b"")
    shell = layout.control / os.path.relpath(TOOL_SHELL, CONTROL_MOUNT)
    shell.parent.mkdir()
    shell.write_text(tool_shell_script(helpers, task_root=runtime))
    if runtime is not None:
        (layout.control / os.path.relpath(HOST_MOUNT, CONTROL_MOUNT)).mkdir()
    shell.chmod(0o755)
    return layout, lock


@dataclass(frozen=True)
class RolloutTree:
    """A sandbox's tree as made for it: laid out, owned by its leased uids, its image mounted; removed and let go
    together."""

    layout: Layout
    owner_lock: OwnerLock
    lease: UidLease

    def remove(self) -> None:
        try:
            remove_rollout(self.layout)
        finally:
            self.owner_lock.release()
            self.lease.release()


def make_tree(
    base_dir: Path | None,
    disk_mb: int,
    helpers: Helpers,
    runtime: HostRuntime | None,
    *,
    image: tuple[Path, str] | None,
    hosts: str,
) -> RolloutTree:
    """In one thread, whole or not at all: the tree, its uids, its image (`image`: the tree to mount and the work
    dir) and the /etc/hosts text for the task's commands (`hosts`, when not empty). A caller that is cancelled
    meanwhile removes what it returns (never while it is still being made)."""
    lease = UidLease()
    try:
        layout, owner_lock = make_layout(base_dir, disk_mb, helpers, runtime)
    except BaseException:
        lease.release()
        raise
    tree = RolloutTree(layout, owner_lock, lease)
    try:
        own_tree(layout, lease.ids)
        if image is not None:
            mount_image(layout, image[0], lease.ids, image[1])
        if hosts:
            layout.task_hosts.write_text(hosts)
    except BaseException:
        tree.remove()
        raise
    return tree


def mount_image(layout: Layout, rootfs: Path, ids: HostIds, workdir: str = WORKDIR) -> Path:
    """The rollout's root: an overlay whose lower layer is the image's cached tree seen id-mapped (its in-image
    owners become the rollout's host uids) and whose writes land on the rollout's own size-bounded disk. The work
    dir is made there now, as Docker's WORKDIR makes it (the image root's), when the image lacks it: the holder
    binds the image's top-level directories into the sandbox's root as it starts, and every command enters it."""
    layout.image_lower.mkdir()
    mount_idmapped(rootfs, layout.image_lower, first=ids.root, count=IMAGE_UIDS)
    changes = layout.fs / "image"
    changes.mkdir(mode=0o700)
    (changes / "upper").mkdir(mode=0o755)
    os.chown(changes / "upper", ids.root, ids.root)
    (changes / "work").mkdir(mode=0o700)
    layout.image_root.mkdir()
    options = f"lowerdir={layout.image_lower},upperdir={changes / 'upper'},workdir={changes / 'work'},nosuid,nodev"
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "-o", options, "rollout-root", str(layout.image_root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        raise SandboxError(f"could not mount the image's overlay: {mounted.stderr.strip()[-500:]}")
    for mount_point in IMAGE_MOUNT_POINTS:
        if not os.path.lexists(layout.image_root / mount_point):
            hostfs_write.make_dirs(layout.image_root, mount_point, owner=(ids.root, ids.root))
    refuse_linked_mount_points(layout.image_root)
    _make_workdir(layout.image_root, workdir, ids)
    layout.task_hosts.write_text(HOSTS)
    os.chown(layout.task_hosts, ids.root, ids.root)
    layout.task_hosts.chmod(0o644)
    return layout.image_root


def _make_workdir(image_root: Path, workdir: str, ids: HostIds) -> None:
    """`workdir` made in the image's tree unless it lies in the rollout's own home or /tmp (bound over the image's)
    or below a link of the image's (made as a link in the sandbox's root, and resolved there)."""
    if any(workdir == kept or workdir.startswith(kept + "/") for kept in (HOME, "/tmp")):
        return
    parts = Path(workdir).parts[1:]
    if any(image_root.joinpath(*parts[:depth]).is_symlink() for depth in range(1, len(parts) + 1)):
        return
    try:
        hostfs_write.make_dirs(image_root, workdir.lstrip("/"), owner=(ids.root, ids.root))
    except OSError as error:
        raise SandboxError(f"the work dir {workdir} cannot be made in the image: {error.strerror or error}") from None


def refuse_linked_mount_points(image_root: Path) -> None:
    """Every path the holder mounts onto in the task's root is the image's own directory (or file), never reached
    through a link: a bind follows a link, and a relative one leads out of the task's root into ours."""
    for mount_point in (*TASK_MOUNT_POINTS, os.path.relpath(HOST_MOUNT, "/")):
        parts = Path(mount_point).parts
        for depth in range(1, len(parts) + 1):
            if image_root.joinpath(*parts[:depth]).is_symlink():
                named = "/" + "/".join(parts[:depth])
                raise SandboxError(f"the image's {named} is a symbolic link; it must be a directory of the image")


def _mount_disk(layout: Layout, disk_mb: int) -> None:
    """The rollout's writable tree on a file system of its own, so its size is bounded (and removal is one
    unmount); without loop devices the tree stays on the host's file system, unbounded, and the result says so.
    1% of it is kept for the host's root: an agent that fills its disk still gets verify's protected files
    written in and its verifier directory made (then verify fails for want of space: the agent's doing). The
    capture proxy's two files (its trace and its log, each bounded by the kernel: proxy_file_bytes) count against
    the same disk limit, so the tree gets what they leave."""
    if not bounded_fs.loop_devices_available():
        return
    size = disk_mb * 2**20 - 2 * proxy_file_bytes(disk_mb)
    failure = bounded_fs.mount_bounded(layout.disk_image, layout.fs, size)
    if failure is not None:
        log.warning("no size-bounded file system for %s: %s", layout.root, failure)


RESERVED_INODES = 256
"""Inodes kept for the hand-over and verify (the protected files, the verifier directory, the grader's HOME, its
bytecode): ext4 keeps blocks for root (-m 1) but no inodes."""


def own_tree(layout: Layout, ids: HostIds) -> None:
    user, root = ids.user, ids.root
    for sub in (WORKDIR, VERIFIER_DIR, AGENT_LOG_DIR, OPENCODE_CONFIG_DIR):
        hostfs_write.make_dirs(layout.fs, sub.lstrip("/"), owner=(user, user))
    layout.agent_home.mkdir(mode=0o700)
    os.chown(layout.agent_home, ids.agent, user)
    agent_tmp = layout.agent_home / os.path.relpath(AGENT_TMP, "/home/opencode")
    agent_tmp.mkdir(mode=0o700)
    os.chown(agent_tmp, ids.agent, ids.agent)
    layout.grader_dir.mkdir(mode=0o700)
    os.chown(layout.grader_dir, ids.grader, ids.grader)
    hostfs_write.make_dirs(layout.fs, "tmp", owner=(user, user))
    hostfs_write.reserve_inodes(layout.inode_reserve, RESERVED_INODES)
    (layout.tmp).chmod(0o1777)
    layout.sockets.mkdir(parents=True, mode=0o700)
    for private in (layout.private, layout.sockets):
        os.chown(private, root, root)
        private.chmod(0o700)


def remove_rollout(layout: Layout) -> None:
    """Unmount, then remove; a tree an image is still mounted in is never walked (it would reach the image)."""
    for mount_point in (layout.image_root, layout.image_lower):
        if mount_point.is_dir() and str(mount_point) in _mount_points():
            subprocess.run(["umount", "--lazy", str(mount_point)], capture_output=True, check=False)
            if str(mount_point) in _mount_points():
                raise SandboxError(f"{mount_point} is still mounted: its rollout's tree is left in place")
    if layout.disk_image.exists():
        subprocess.run(["umount", "--lazy", str(layout.fs)], capture_output=True, check=False)
        layout.disk_image.unlink(missing_ok=True)
    hostfs_write.remove_tree(layout.sockets)
    hostfs_write.remove_tree(layout.root)


def _mount_points() -> set[str]:
    """This mount namespace's mount points (/proc/self/mountinfo's fifth field, octal escapes decoded)."""
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        field = line.split(" ")[4]
        points.add(re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field))
    return points


def reap_orphans(base_dir: Path | None) -> list[str]:
    """Remove the trees (and cgroups, mounts) of rollouts whose server died; live servers' trees are untouched, and
    so is anything named like a tree that this user did not make (a shared /tmp's): a directory and its lock both
    this user's, never through a link."""
    base = base_dir or Path(tempfile.gettempdir())
    reaped = []
    for root in sorted(base.glob(f"{PREFIX}*")):
        if not _made_by_us(root):
            continue
        handle = try_lock(root / OWNER_LOCK, create=False)
        if handle is None:
            continue
        with handle:
            version = detect()
            if version is not None:
                if ServicesFreezer.available(version):
                    ServicesFreezer(root.name, version).destroy()
                for name in (root.name, proxy_cgroup_name(root.name)):
                    Cgroup(name, version).destroy()
            remove_rollout(Layout(root))
        reaped.append(root.name)
        log.warning("reaped %s, left by a server that is gone", root)
    return reaped


def _made_by_us(root: Path) -> bool:
    try:
        found = os.lstat(root)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid()
