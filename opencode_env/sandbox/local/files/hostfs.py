"""Host-side file access inside a rollout's tree that never trusts the sandbox: the link-proof path walk, and reads
(hostfs_write.py writes, hands paths over and removes trees with the same walk).

Every path is walked one component at a time from a directory descriptor with O_NOFOLLOW (inside/nofollow.py), so a
symlink the sandbox planted at any component (or a component swapped for one while we walk) is never followed: reads
fail, and the functions that hand a path to the grader (`reset_dir`, `place_file`, `chown_tree`) replace whatever is
in the way by a real directory or file instead. Only regular files are read, tails are read with a size cap, walks
are iterative with depth, entry and time caps, and trees of any depth are changed or removed without recursion and
with one descriptor open at a time. Names are `str` as the os module gives them: a name that is not UTF-8 carries
its bytes as lone surrogates (`os.fsencode` gives them back). Callers run these blocking functions off the event
loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from opencode_env.inside import nofollow
from opencode_env.inside.nofollow import DIR_FLAGS

MAX_WALK_DEPTH = 64
MAX_WALK_S = 5.0
MAX_DIR_ENTRIES = 100_000
"""A listing reads at most this many entries of one directory (the first ones the kernel gives): an agent can make
millions, and reading and sorting them all would cost seconds and hundreds of megabytes."""
DIR_MODE = 0o755
GONE_OR_NOT_A_DIR = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)

Owner = tuple[int, int]


class UnsafePath(OSError):
    """A path component is a symlink or not the kind of file expected: the sandbox tampered with it."""


def components(relative: str) -> list[str]:
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        raise UnsafePath(errno.EPERM, f"'..' in {relative!r}")
    return parts


def _open_path(root: Path, parts: list[str], *, create: bool = False, owner: Owner | None = None) -> int:
    """A descriptor of root/parts..., every component opened without following symlinks (made when `create`)."""
    fd = os.open(root, DIR_FLAGS)
    step = functools.partial(_open_component, owner=owner) if create else None
    try:
        return nofollow.open_dir(fd, parts, step)
    except nofollow.StepFailed as failed:
        raise _refused(failed.error, parts[failed.index]) from None
    finally:
        os.close(fd)


def _refused(error: OSError, part: str) -> OSError:
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        return UnsafePath(error.errno, f"{part!r} is not a plain directory")
    return error


def _open_component(fd: int, part: str, *, owner: Owner | None) -> int:
    """The directory `part` in `fd`, made (owned by `owner`) when it is missing."""
    try:
        return os.open(part, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        pass
    with contextlib.suppress(FileExistsError):
        os.mkdir(part, DIR_MODE, dir_fd=fd)
    child = os.open(part, DIR_FLAGS, dir_fd=fd)
    if owner is not None:
        os.fchown(child, *owner)
    return child


@contextlib.contextmanager
def open_dir(root: Path, parts: list[str], *, create: bool = False, owner: Owner | None = None) -> Iterator[int]:
    fd = _open_path(root, parts, create=create, owner=owner)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_file(root: Path, relative: str) -> int:
    parts = components(relative)
    if not parts:
        raise IsADirectoryError(relative)
    with open_dir(root, parts[:-1]) as parent:
        try:
            return nofollow.open_file(parent, parts[-1])
        except nofollow.NotRegular:
            raise UnsafePath(errno.EINVAL, f"{relative!r} is not a regular file") from None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise UnsafePath(error.errno, f"{relative!r} is a symlink") from error
            if error.errno == errno.ENXIO:
                raise UnsafePath(error.errno, f"{relative!r} is a socket") from error
            raise


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
        start = _open_path(root, components(relative))
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
        if error.errno in (*GONE_OR_NOT_A_DIR, errno.EACCES, errno.EPERM):
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
