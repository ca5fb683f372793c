"""Host-side file access inside a rollout's tree that never trusts the sandbox.

Every path is walked one component at a time from a directory descriptor with O_NOFOLLOW, so a symlink the
sandbox planted at any component (or a component swapped for one while we walk) is never followed: reads fail,
and the functions that hand a path to the grader (`reset_dir`, `place_file`, `chown_tree`) replace whatever is in
the way by a real directory or file instead. Only regular files are read, tails are read with a size cap, walks are
iterative with depth, entry and time caps, and trees of any depth are changed or removed without recursion and
with one descriptor open at a time. Names are `str` as the os module gives them: a name that is not UTF-8 carries
its bytes as lone surrogates (`os.fsencode` gives them back). Callers run these blocking functions off the event
loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_WALK_DEPTH = 64
MAX_WALK_S = 5.0
MAX_DIR_ENTRIES = 100_000
"""A listing reads at most this many entries of one directory (the first ones the kernel gives): an agent can make
millions, and reading and sorting them all would cost seconds and hundreds of megabytes."""
DIR_MODE = 0o755
_GONE_OR_NOT_A_DIR = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)

Owner = tuple[int, int]
Identity = tuple[int, int]


class UnsafePath(OSError):
    """A path component is a symlink or not the kind of file expected: the sandbox tampered with it."""


def _components(relative: str) -> list[str]:
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        raise UnsafePath(errno.EPERM, f"'..' in {relative!r}")
    return parts


def _open_path(root: Path, parts: list[str], *, create: bool = False, owner: Owner | None = None) -> int:
    """A descriptor of root/parts..., every component opened without following symlinks."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            child = _open_component(fd, part, create=create, owner=owner)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_component(fd: int, part: str, *, create: bool, owner: Owner | None) -> int:
    try:
        return os.open(part, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(error.errno, f"{part!r} is not a plain directory") from error
        raise
    with contextlib.suppress(FileExistsError):
        os.mkdir(part, DIR_MODE, dir_fd=fd)
    child = os.open(part, DIR_FLAGS, dir_fd=fd)
    if owner is not None:
        os.fchown(child, *owner)
    return child


@contextlib.contextmanager
def _open_dir(root: Path, parts: list[str], *, create: bool = False, owner: Owner | None = None) -> Iterator[int]:
    fd = _open_path(root, parts, create=create, owner=owner)
    try:
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
            if error.errno == errno.ENXIO:
                raise UnsafePath(error.errno, f"{relative!r} is a socket") from error
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


def write_file(root: Path, relative: str, data: bytes, *, owner: Owner | None = None, mode: int = 0o644) -> None:
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


def make_dirs(root: Path, relative: str, *, owner: Owner | None = None) -> None:
    with _open_dir(root, _components(relative), create=True, owner=owner):
        pass


def reset_dir(base: Path, relative: str, *, owner: Owner, mode: int = DIR_MODE) -> None:
    """base/relative becomes a new, empty directory of owner's with `mode`; whatever was there is removed, and each
    component above it that is not a real directory (a symlink, file, fifo, socket, or nothing) is replaced by an
    empty directory of owner's. Real directories above it are kept as they are."""
    parts = _components(relative)
    if not parts:
        with _open_dir(base, []) as fd:
            _walk(fd, _Remover())
            _own(fd, owner, mode)
        return
    with _real_dirs(base, parts[:-1], owner) as parent:
        _remove_entry(parent, parts[-1])
        os.close(_make_dir(parent, parts[-1], owner, mode))


def place_file(base: Path, relative: str, data: bytes, *, owner: Owner, mode: int = 0o644) -> None:
    """base/relative becomes a new regular file holding exactly `data`, of owner's with `mode`. Whatever was at the
    path (a symlink, a directory tree, a fifo, a hard link to another name) is removed first, never followed or
    written through; the components above it are made real directories as in `reset_dir`."""
    parts = _components(relative)
    if not parts:
        raise IsADirectoryError(relative)
    with _real_dirs(base, parts[:-1], owner) as parent:
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
    parts = _components(relative)
    if not parts:
        with _open_dir(base, []) as fd:
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
        if error.errno in _GONE_OR_NOT_A_DIR:
            return None
        raise


def _make_dir(parent: int, name: str, owner: Owner, mode: int) -> int:
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.EEXIST, *_GONE_OR_NOT_A_DIR):
            raise UnsafePath(error.errno, f"{name!r} changed while it was replaced") from error
        raise
    try:
        _own(fd, owner, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _real_dirs(base: Path, parts: list[str], owner: Owner) -> Iterator[int]:
    """A descriptor of base/parts..., each component that is not a real directory replaced by a new one."""
    fd = os.open(base, DIR_FLAGS)
    try:
        for part in parts:
            child = _open_subdir(fd, part)
            if child is None:
                _remove_entry(fd, part)
                child = _make_dir(fd, part, owner, DIR_MODE)
            os.close(fd)
            fd = child
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


@dataclass(frozen=True)
class Entry:
    path: str
    size: int


@dataclass
class _Listed:
    fd: int
    prefix: str
    pending: list[str] = field(default_factory=list)
    """Subdirectories still to list, last first (`pop` gives the next in sorted order)."""


def list_files(root: Path, relative: str, *, limit: int, skip_dirs: frozenset[str] = frozenset()) -> list[Entry]:
    """Regular files under root/relative, depth first in sorted order, within depth, count, per-directory and time
    caps; at most MAX_WALK_DEPTH + 1 descriptors open. A start that is missing or not a real directory lists
    nothing."""
    try:
        start = _open_path(root, _components(relative))
    except (FileNotFoundError, UnsafePath):
        return []
    entries: list[Entry] = []
    deadline = time.monotonic() + MAX_WALK_S
    stack = [_Listed(start, "")]
    try:
        stack[0].pending = _scan(start, "", entries, limit, skip_dirs)
        while stack and len(entries) < limit and time.monotonic() < deadline:
            level = stack[-1]
            if not level.pending:
                os.close(stack.pop().fd)
                continue
            name = level.pending.pop()
            child = _open_listable(level.fd, name)
            if child is None:
                continue
            listed = _Listed(child, f"{level.prefix}{name}/")
            stack.append(listed)
            subdirs = _scan(child, listed.prefix, entries, limit, skip_dirs)
            listed.pending = subdirs if len(stack) <= MAX_WALK_DEPTH else []
    finally:
        for level in stack:
            os.close(level.fd)
    return entries


def _open_listable(parent: int, name: str) -> int | None:
    """None for a directory gone, swapped for a link, or unreadable (mode 000 when the server is not root)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (*_GONE_OR_NOT_A_DIR, errno.EACCES, errno.EPERM):
            return None
        raise


def _scan(fd: int, prefix: str, entries: list[Entry], limit: int, skip_dirs: frozenset[str]) -> list[str]:
    """Append the directory's regular files to entries (up to limit); return its subdirectories, last first."""
    with os.scandir(fd) as listing:
        children = sorted(
            ((child.name, child.is_dir(follow_symlinks=False)) for child in itertools.islice(listing, MAX_DIR_ENTRIES)),
        )
    subdirs = []
    for name, is_dir in children:
        if is_dir:
            if name not in skip_dirs:
                subdirs.append(name)
        elif len(entries) < limit:
            size = _regular_size(fd, name)
            if size is not None:
                entries.append(Entry(prefix + name, size))
    subdirs.reverse()
    return subdirs


def _regular_size(parent: int, name: str) -> int | None:
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
