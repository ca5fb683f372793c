"""Host-side changes inside a rollout's tree that never trust the sandbox: files written, paths handed to another
owner, trees removed (hostfs.py walks the paths and reads).

Writing refuses a symlink or non-file in the way. The functions that hand a path to the grader (`reset_dir`,
`place_file`, `chown_tree`) replace whatever is in the way by a real directory or file instead of following it.
Trees of any depth are changed or removed without recursion and with one descriptor open at a time. Callers run
these blocking functions off the event loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from opencode_env.inside.nofollow import DIR_FLAGS
from opencode_env.sandbox.local.files.hostfs import (
    DIR_MODE,
    GONE_OR_NOT_A_DIR,
    Owner,
    UnsafePath,
    components,
    open_dir,
)

Identity = tuple[int, int]


def write_file(root: Path, relative: str, data: bytes, *, owner: Owner | None = None, mode: int = 0o644) -> None:
    """Create or replace the file; a symlink or non-file in its place is an error, never followed."""
    parts = components(relative)
    with open_dir(root, parts[:-1], create=True, owner=owner) as parent:
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


def make_dirs(root: Path, relative: str, *, owner: Owner | None = None) -> None:
    with open_dir(root, components(relative), create=True, owner=owner):
        pass


def reset_dir(base: Path, relative: str, *, owner: Owner, mode: int = DIR_MODE) -> None:
    """base/relative becomes a new, empty directory of owner's with `mode`; whatever was there is removed, and each
    component above it that is not a real directory (a symlink, file, fifo, socket, or nothing) is replaced by an
    empty directory of owner's. Real directories above it are kept as they are."""
    parts = components(relative)
    if not parts:
        with open_dir(base, []) as fd:
            _walk(fd, _Remover())
            _own(fd, owner, mode)
        return
    with _real_dirs(base, parts[:-1], owner) as parent:
        _remove_entry(parent, parts[-1])
        os.close(_make_dir(parent, parts[-1], owner, mode))


def place_file(
    base: Path, relative: str, data: bytes, *, owner: Owner, mode: int = 0o644, sealed_from: int | None = None
) -> None:
    """base/relative becomes a new regular file holding exactly `data`, of owner's with `mode`. Whatever was at the
    path (a symlink, a directory tree, a fifo, a hard link to another name) is removed first, never followed or
    written through; the components above it are made real directories as in `reset_dir`. `sealed_from`: the
    directories above it from that component on become owner's too, DIR_MODE (only owner adds, renames or removes
    entries in them), whoever had them."""
    parts = components(relative)
    if not parts:
        raise IsADirectoryError(relative)
    with _real_dirs(base, parts[:-1], owner, seal_from=sealed_from) as parent:
        _remove_entry(parent, parts[-1])
        try:
            fd = os.open(
                parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
            )
        except FileExistsError as error:
            raise UnsafePath(errno.EEXIST, f"{relative!r} reappeared while it was replaced") from error
        with os.fdopen(fd, "wb") as handle:
            _own(handle.fileno(), owner, mode)
            handle.write(data)


def chown_tree(base: Path, relative: str, *, owner: Owner) -> int:
    """Give base/relative and everything under it to owner (symlinks themselves, never their targets); returns how
    many entries under it changed hands. When it is missing or not a directory, it becomes an empty directory of
    owner's (as in `reset_dir`) and the count is 0."""
    parts = components(relative)
    if not parts:
        with open_dir(base, []) as fd:
            return _chown_walk(fd, owner)
    with _real_dirs(base, parts[:-1], owner) as parent:
        top = _open_subdir(parent, parts[-1])
        if top is None:
            _remove_entry(parent, parts[-1])
            os.close(_make_dir(parent, parts[-1], owner, DIR_MODE))
            return 0
        try:
            return _chown_walk(top, owner)
        finally:
            os.close(top)


def _own(fd: int, owner: Owner, mode: int) -> None:
    """Owner first: a chown clears set-id bits, which `mode` may ask for."""
    os.fchown(fd, *owner)
    os.fchmod(fd, mode)


def _open_subdir(parent: int, name: str) -> int | None:
    """The real directory parent/name, opened; None when nothing or something else (a symlink, a file) is there."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in GONE_OR_NOT_A_DIR:
            return None
        raise


def _make_dir(parent: int, name: str, owner: Owner, mode: int) -> int:
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.EEXIST, *GONE_OR_NOT_A_DIR):
            raise UnsafePath(error.errno, f"{name!r} changed while it was replaced") from error
        raise
    try:
        _own(fd, owner, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _real_dirs(base: Path, parts: list[str], owner: Owner, *, seal_from: int | None = None) -> Iterator[int]:
    """A descriptor of base/parts..., each component that is not a real directory replaced by a new one; those from
    index `seal_from` on made owner's, DIR_MODE."""
    fd = os.open(base, DIR_FLAGS)
    try:
        for index, part in enumerate(parts):
            child = _open_subdir(fd, part)
            if child is None:
                _remove_entry(fd, part)
                child = _make_dir(fd, part, owner, DIR_MODE)
            os.close(fd)
            fd = child
            if seal_from is not None and index >= seal_from:
                _own(fd, owner, DIR_MODE)
        yield fd
    finally:
        os.close(fd)


def _remove_entry(parent: int, name: str) -> None:
    """Remove parent/name, whatever it is (a link is unlinked, never followed); nothing there is fine."""
    try:
        os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            _walk(fd, _Remover())
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)


def _chown_walk(fd: int, owner: Owner) -> int:
    chowner = _Chowner(owner)
    _walk(fd, chowner)
    return chowner.count


class _TreeVisitor(Protocol):
    def enter(self, fd: int) -> list[str]:
        """Handle the open directory and its entries that are not directories; return its subdirectories."""
        ...

    def not_a_dir(self, parent: int, name: str) -> None:
        """parent/name was listed as a directory but is something else (or nothing) now."""
        ...

    def leave(self, parent: int, name: str) -> None:
        """parent/name and everything under it have been walked."""
        ...


@dataclass
class _Level:
    identity: Identity
    name: str
    pending: list[str]


def _walk(top: int, visitor: _TreeVisitor) -> None:
    """Depth first under the open directory `top` (left open), holding one descriptor whatever the depth: down by
    name without following links, up through '..' checked against the directory we came down from (a directory
    the sandbox moved away while we walked it is an error, never a way out of the tree)."""
    fd = os.dup(top)
    try:
        levels = [_Level(_identity(fd), "", visitor.enter(fd))]
        while levels:
            level = levels[-1]
            if level.pending:
                name = level.pending.pop()
                child = _open_subdir(fd, name)
                if child is None:
                    visitor.not_a_dir(fd, name)
                    continue
                os.close(fd)
                fd = child
                levels.append(_Level(_identity(fd), name, visitor.enter(fd)))
                continue
            levels.pop()
            if levels:
                parent = _open_parent(fd, levels[-1].identity)
                os.close(fd)
                fd = parent
                visitor.leave(fd, level.name)
    finally:
        os.close(fd)


def _identity(fd: int) -> Identity:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _open_parent(fd: int, expected: Identity) -> int:
    parent = os.open("..", DIR_FLAGS, dir_fd=fd)
    if _identity(parent) != expected:
        os.close(parent)
        raise UnsafePath(errno.ESTALE, "a directory was moved while it was walked")
    return parent


def _entries(fd: int) -> list[tuple[str, bool]]:
    """(name, is a directory) for each entry; the kind comes from the directory itself, no link is followed."""
    with os.scandir(fd) as listing:
        return [(child.name, child.is_dir(follow_symlinks=False)) for child in listing]


def _subdirs(fd: int, visitor: _TreeVisitor) -> list[str]:
    """The directory's subdirectories, after handing each of its other entries to the visitor."""
    subdirs = []
    for name, is_dir in _entries(fd):
        if is_dir:
            subdirs.append(name)
        else:
            visitor.not_a_dir(fd, name)
    return subdirs


class _Remover:
    def enter(self, fd: int) -> list[str]:
        return _subdirs(fd, self)

    def not_a_dir(self, parent: int, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)

    def leave(self, parent: int, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=parent)


@dataclass
class _Chowner:
    owner: Owner
    count: int = 0

    def enter(self, fd: int) -> list[str]:
        os.fchown(fd, *self.owner)
        return _subdirs(fd, self)

    def not_a_dir(self, parent: int, name: str) -> None:
        try:
            os.chown(name, *self.owner, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        self.count += 1

    def leave(self, parent: int, name: str) -> None:
        self.count += 1


def remove_tree(path: Path) -> None:
    """Delete a directory tree of any depth without recursion and without following symlinks."""
    try:
        top = os.open(path, DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        _walk(top, _Remover())
    finally:
        os.close(top)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def reserve_inodes(directory: Path, count: int) -> None:
    """`count` empty files in a new directory only the host's root can open."""
    directory.mkdir(mode=0o700)
    for index in range(count):
        os.close(os.open(directory / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def release_inodes(directory: Path) -> int:
    """The reserve's files removed (their inodes free again); how many there were."""
    released = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            os.unlink(entry.path)
            released += 1
    return released
