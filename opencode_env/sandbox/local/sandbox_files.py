"""A local sandbox's files, from the host side: which host directory a sandbox path names, and every read and
write there through hostfs (no symlink followed, regular files only, reads capped)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path

from opencode_env.sandbox import tree_carry
from opencode_env.sandbox.base import (
    HANDED_FILE_MODE,
    HOME,
    LOGS_DIR,
    REWARD_FILE_MODE,
    REWARD_FILES,
    VERIFIER_DIR,
    VERIFIER_DIR_MODE,
    WORKDIR,
    CarryLimits,
    CarryReport,
    FileEntry,
    Identity,
    SandboxError,
    sealed_dirs,
    task_path,
)
from opencode_env.sandbox.grader_python import GRADER_PYTHON_DIR, GRADER_PYTHON_FILES
from opencode_env.sandbox.local.compartment import Compartment
from opencode_env.sandbox.local.files import hostfs, hostfs_write
from opencode_env.sandbox.local.isolation.bubblewrap import AGENT_HOME, CONTROL_MOUNT, GRADER_DIR, HARBOR_LOGS
from opencode_env.wire.task_paths import TASK_TMP, OutsideTaskRoots, confined_dir, confined_file, task_root_of

MAX_READ_BYTES = 64 * 1024 * 1024


class SandboxFiles:
    """Reads and writes a sandbox's files from the host side."""

    def __init__(self, compartment: Compartment) -> None:
        self._compartment = compartment
        self._layout = compartment.layout
        self._ids = compartment.ids

    def _relative(self, path: str) -> tuple[Path, str]:
        """The host directory and the path under it that a sandbox path names (within /home/user or /tmp)."""
        absolute = path if path.startswith("/") else f"{WORKDIR}/{path}"
        normal = os.path.normpath(absolute)
        if normal == HOME or normal.startswith(HOME + "/"):
            return self._layout.home, os.path.relpath(normal, HOME)
        if normal == "/tmp" or normal.startswith("/tmp/"):
            return self._layout.tmp, os.path.relpath(normal, "/tmp")
        if normal == AGENT_HOME or normal.startswith(AGENT_HOME + "/"):
            return self._layout.agent_home, os.path.relpath(normal, AGENT_HOME)
        if self._compartment.image is not None:
            if normal == HARBOR_LOGS or normal.startswith(HARBOR_LOGS + "/"):
                return self._layout.home, os.path.normpath(f"logs/{os.path.relpath(normal, HARBOR_LOGS)}")
            return self._layout.image_root, os.path.relpath(normal, "/")
        raise SandboxError(f"path {path!r} is outside the sandbox's writable area ({HOME}, /tmp and {AGENT_HOME})")

    def _task_relative(self, path: str) -> tuple[Path, str]:
        """The host directory and the path under it where a task's path (a request's file, its work dir) is
        written: the task's home, its /tmp, or the image's own tree (its overlay), each by its allow-listed root
        (wire/task_paths.py). OpenCode's home, the grader's, the control and the proxy's directories are none of
        these, so no task path reaches them, however it is spelled."""
        workdir = self._compartment.spec.workdir
        try:
            normal = confined_file(path, workdir) if path != workdir else confined_dir(path)
        except OutsideTaskRoots as error:
            raise SandboxError(f"refusing to write {path[:200]!r}, outside the task's roots: {error}") from None
        if self._compartment.image is not None and task_root_of(normal) == HARBOR_LOGS:
            normal = posixpath.normpath(f"{LOGS_DIR}/{posixpath.relpath(normal, HARBOR_LOGS)}")
            if task_root_of(normal) is None:
                raise SandboxError(
                    f"refusing to write {path[:200]!r}: {HARBOR_LOGS} is {LOGS_DIR} here, and {normal} ours"
                )
        root = task_root_of(normal)
        if root == HOME:
            return self._layout.home, posixpath.relpath(normal, HOME)
        if root == TASK_TMP:
            return self._layout.tmp, posixpath.relpath(normal, TASK_TMP)
        if root is not None and self._compartment.image is not None:
            return self._layout.image_root, normal.lstrip("/")
        raise SandboxError(f"refusing to write {path[:200]!r}: outside {HOME} and /tmp, a task's roots without image")

    async def write_file(self, path: str, data: str | bytes, *, identity: Identity = "user") -> None:
        """A task's file, written as `identity` (the sandbox's root writes mode 0600, the others 0644), inside the
        task's roots only."""
        await self._write(self._task_relative(path), path, data, identity)

    async def write_machine_file(self, path: str, data: str | bytes, *, identity: Identity = "user") -> None:
        """Where a machine's own file API would write (the cloud fakes' VMs are local sandboxes): through the host's
        map of the sandbox, OpenCode's home included. Never a request's path: those go through `write_file`."""
        await self._write(self._relative(path), path, data, identity)

    async def _write(self, place: tuple[Path, str], path: str, data: str | bytes, identity: Identity) -> None:
        base, relative = place
        raw = data.encode("utf-8") if isinstance(data, str) else data
        uid = self._ids.of(identity)
        owner, mode = (uid, uid), 0o600 if identity == "root" else 0o644
        try:
            await asyncio.to_thread(hostfs_write.write_file, base, relative, raw, owner=owner, mode=mode)
        except hostfs.UnsafePath as error:
            raise SandboxError(f"refusing to write {path}: {error.strerror}") from error

    async def write_control_file(self, name: str, data: str) -> str:
        """A file the sandbox can read but not change or replace; returns its path inside the sandbox."""
        await asyncio.to_thread(hostfs_write.write_file, self._layout.control, name, data.encode("utf-8"))
        return f"{CONTROL_MOUNT}/{name}"

    async def read_file(self, path: str) -> bytes:
        base, relative = self._relative(path)
        try:
            return await asyncio.to_thread(hostfs.read_file, base, relative, MAX_READ_BYTES)
        except (hostfs.UnsafePath, IsADirectoryError, NotADirectoryError) as error:
            raise FileNotFoundError(path) from error

    async def read_tail(self, path: str, limit: int) -> bytes:
        base, relative = self._relative(path)
        try:
            return await asyncio.to_thread(hostfs.read_tail, base, relative, limit)
        except (hostfs.UnsafePath, IsADirectoryError, NotADirectoryError) as error:
            raise FileNotFoundError(path) from error

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        base, relative = self._relative(root)
        entries = await asyncio.to_thread(hostfs.list_files, base, relative, limit=limit)
        return [FileEntry(entry.path, entry.size) for entry in entries]

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        """From the host side, never following a link the agent left: the work dir becomes the grader's, the
        verifier directory the reward channel (base.REWARD_FILES: nothing else in it), and each protected file is
        written in, replacing whatever the agent left at its path (a directory in the way of one is replaced too)."""
        grader = (self._ids.grader, self._ids.grader)
        workdir = self._compartment.spec.workdir
        targets = {task_path(path, workdir): text for path, text in protected.items()}
        placed = {target: self._task_relative(target) for target in targets}
        if self._layout.inode_reserve.is_dir():
            await asyncio.to_thread(hostfs_write.release_inodes, self._layout.inode_reserve)
        home = self._layout.home
        await asyncio.to_thread(hostfs_write.chown_tree, *self._task_relative(workdir), owner=grader)
        channel = (self._ids.root, self._ids.grader)
        verifier = VERIFIER_DIR.removeprefix(HOME + "/")
        await asyncio.to_thread(hostfs_write.reset_dir, home, verifier, owner=channel, mode=VERIFIER_DIR_MODE)
        for reward in REWARD_FILES:
            relative = reward.removeprefix(HOME + "/")
            await asyncio.to_thread(hostfs_write.place_file, home, relative, b"", owner=channel, mode=REWARD_FILE_MODE)
        await asyncio.to_thread(hostfs_write.reset_dir, self._layout.grader_dir, "home", owner=grader, mode=0o700)
        for name, text in GRADER_PYTHON_FILES.items():
            startup = posixpath.join(posixpath.relpath(GRADER_PYTHON_DIR, GRADER_DIR), name)
            await asyncio.to_thread(
                hostfs_write.place_file, self._layout.grader_dir, startup, text.encode("utf-8"), owner=grader
            )
        task = (self._ids.root, self._ids.root)
        for target, text in targets.items():
            base, relative = placed[target]
            sealed_from = len(hostfs.components(relative)) - 1 - len(sealed_dirs(target, workdir))
            await asyncio.to_thread(
                hostfs_write.place_file,
                base,
                relative,
                text.encode("utf-8"),
                owner=task,
                mode=HANDED_FILE_MODE,
                sealed_from=sealed_from,
            )

    def workdir_on_host(self) -> tuple[Path, str]:
        """The host directory and the path under it where this sandbox's work dir lives (its home, or the image's
        overlay root), to be walked from there without following a link."""
        return self._task_relative(self._compartment.spec.workdir)

    async def carry_workdir_to(
        self, target: SandboxFiles, *, keep: tuple[str, ...], limits: CarryLimits
    ) -> CarryReport:
        """The host reads this sandbox's work dir as data (from outside all its namespaces) and writes the copy into
        `target`'s, owned by `target`'s user: no command runs in either sandbox."""
        owner = (target._ids.user, target._ids.user)
        source, into = self.workdir_on_host(), target.workdir_on_host()
        report = await asyncio.to_thread(_carry_between, source, into, owner, keep, limits)
        report.skipped += await asyncio.to_thread(_left_above, source, into)
        return report


def _carry_between(
    source: tuple[Path, str], target: tuple[Path, str], owner: hostfs.Owner, keep: tuple[str, ...], limits: CarryLimits
) -> CarryReport:
    with contextlib.ExitStack() as opened:
        into = opened.enter_context(hostfs.open_dir(target[0], hostfs.components(target[1]), create=True, owner=owner))
        tree_carry.clear(into)
        try:
            from_fd = opened.enter_context(hostfs.open_dir(source[0], hostfs.components(source[1])))
        except hostfs.UnsafePath:
            return CarryReport(skipped=[tree_carry.Skipped(".", "symlink")])
        except FileNotFoundError:
            return CarryReport()
        sink = tree_carry.DirSink(into, owner)
        opened.callback(sink.close)
        return tree_carry.carry(from_fd, sink, limits, keep)


def _left_above(source: tuple[Path, str], target: tuple[Path, str]) -> list[tree_carry.Skipped]:
    """What the agent added directly in the directories above its work dir (its HOME, say: a pytest.ini, a
    conftest.py there steer a test run), against the grader box's same directories: none of it is carried, each is
    recorded (names only, nothing read, nothing followed)."""
    parts = hostfs.components(source[1])
    found = []
    for depth in range(len(parts)):
        above = parts[:depth]
        try:
            with hostfs.open_dir(source[0], above) as theirs, hostfs.open_dir(target[0], above) as ours:
                added = _names(theirs) - _names(ours) - {parts[depth]}
        except (OSError, hostfs.UnsafePath):
            continue
        up = "../" * (len(parts) - depth)
        found += [tree_carry.Skipped(up + name, "outside") for name in sorted(added)]
    return found


def _names(fd: int) -> set[str]:
    with os.scandir(fd) as listing:
        return {entry.name for _, entry in zip(range(hostfs.MAX_DIR_ENTRIES), listing, strict=False)}
