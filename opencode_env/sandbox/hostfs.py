"""Host-side file access inside a rollout's tree that never trusts the sandbox.

Every path is walked one component at a time from a directory descriptor with O_NOFOLLOW, so a symlink the
sandbox planted at any component (or a component swapped for one while we walk) makes the call fail instead of
leading the server out of the tree. Only regular files are read, tails are read with a size cap, walks are
iterative with depth, entry and time caps, and trees are removed without recursion. Callers run these blocking
functions off the event loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_WALK_DEPTH = 64
MAX_WALK_S = 5.0


class UnsafePath(OSError):
    """A path component is a symlink or not the kind of file expected: the sandbox tampered with it."""


def _components(relative: str) -> list[str]:
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        raise UnsafePath(errno.EPERM, f"'..' in {relative!r}")
    return parts


@contextlib.contextmanager
def _open_dir(
    root: Path, parts: list[str], *, create: bool = False, owner: tuple[int, int] | None = None
) -> Iterator[int]:
    """A descriptor of root/parts..., every component opened without following symlinks."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
                if owner is not None:
                    os.fchown(child, *owner)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(error.errno, f"{part!r} is not a plain directory") from error
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_file(root: Path, relative: str) -> int:
    parts = _components(relative)
    if not parts:
        raise IsADirectoryError(relative)
    with _open_dir(root, parts[:-1]) as parent:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise UnsafePath(error.errno, f"{relative!r} is a symlink") from error
            raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(errno.EINVAL, f"{relative!r} is not a regular file")
    return fd


def read_file(root: Path, relative: str, limit: int) -> bytes:
    """The file's first `limit` bytes; FileNotFoundError when absent, UnsafePath when it is not a plain file."""
    fd = _open_file(root, relative)
    with os.fdopen(fd, "rb") as handle:
        return handle.read(limit)


def read_tail(root: Path, relative: str, limit: int) -> bytes:
    """The file's last `limit` bytes, without reading the rest."""
    fd = _open_file(root, relative)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - limit))
        return handle.read(limit)


def write_file(
    root: Path, relative: str, data: bytes, *, owner: tuple[int, int] | None = None, mode: int = 0o644
) -> None:
    """Create or replace the file; a symlink or non-file in its place is an error, never followed."""
    parts = _components(relative)
    with _open_dir(root, parts[:-1], create=True, owner=owner) as parent:
        with contextlib.suppress(FileNotFoundError):
            existing = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISREG(existing.st_mode):
                raise UnsafePath(errno.EEXIST, f"{relative!r} exists and is not a regular file")
            os.unlink(parts[-1], dir_fd=parent)
        fd = os.open(
            parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent
        )
        with os.fdopen(fd, "wb") as handle:
            if owner is not None:
                os.fchown(handle.fileno(), *owner)
            handle.write(data)


def make_dirs(root: Path, relative: str, *, owner: tuple[int, int] | None = None) -> None:
    with _open_dir(root, _components(relative), create=True, owner=owner):
        pass


@dataclass(frozen=True)
class Entry:
    path: str
    size: int


def list_files(root: Path, relative: str, *, limit: int, skip_dirs: frozenset[str] = frozenset()) -> list[Entry]:
    """Regular files under root/relative in sorted order, iteratively, within depth, count and time caps."""
    try:
        base = os.open(root, DIR_FLAGS)
    except FileNotFoundError:
        return []
    entries: list[Entry] = []
    deadline = time.monotonic() + MAX_WALK_S
    try:
        try:
            with _open_dir(root, _components(relative)) as start:
                stack: list[tuple[int, str, int]] = [(os.dup(start), "", 0)]
        except (FileNotFoundError, UnsafePath):
            return []
        while stack and len(entries) < limit and time.monotonic() < deadline:
            fd, prefix, depth = stack.pop()
            try:
                subdirs = _scan(fd, prefix, entries, limit)
                if depth < MAX_WALK_DEPTH:
                    for name in reversed(subdirs):
                        if name in skip_dirs:
                            continue
                        with contextlib.suppress(OSError):
                            stack.append((os.open(name, DIR_FLAGS, dir_fd=fd), f"{prefix}{name}/", depth + 1))
            finally:
                os.close(fd)
        for fd, _, _ in stack:
            os.close(fd)
    finally:
        os.close(base)
    return entries


def _scan(fd: int, prefix: str, entries: list[Entry], limit: int) -> list[str]:
    subdirs: list[str] = []
    with os.scandir(fd) as listing:
        children = sorted(listing, key=lambda child: child.name)
    for child in children:
        info = child.stat(follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            subdirs.append(child.name)
        elif stat.S_ISREG(info.st_mode) and len(entries) < limit:
            entries.append(Entry(prefix + child.name, info.st_size))
    return subdirs


def remove_tree(path: Path) -> None:
    """Delete a directory tree of any depth without recursion and without following symlinks."""
    try:
        top = os.open(path, DIR_FLAGS)
    except FileNotFoundError:
        return
    stack: list[tuple[int, str]] = [(top, "")]
    while stack:
        fd, name = stack[-1]
        child = _first_subdir_emptying_files(fd)
        if child is not None:
            stack.append(child)
            continue
        os.close(fd)
        stack.pop()
        if stack:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(name, dir_fd=stack[-1][0])
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def _first_subdir_emptying_files(fd: int) -> tuple[int, str] | None:
    """Unlink the directory's non-directories; return the first subdirectory (opened) still to empty, if any."""
    with os.scandir(fd) as listing:
        names = [(child.name, child.is_dir(follow_symlinks=False)) for child in listing]
    for name, is_dir in names:
        if not is_dir:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
            continue
        try:
            return os.open(name, DIR_FLAGS, dir_fd=fd), name
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
    return None
