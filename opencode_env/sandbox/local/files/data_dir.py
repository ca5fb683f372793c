"""A directory read as data (a task dir, a build context): every path below it is opened one component at a time
relative to its parent's descriptor with O_NOFOLLOW (inside/nofollow.py), so a symbolic link anywhere is refused
with its path named and nothing outside the directory is ever opened; files are opened O_NONBLOCK and read only when
fstat says they are regular (a FIFO never blocks the reader), and reads are bounded.

The directory itself is the operator's choice (named on the command line) and may be reached through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from opencode_env.inside import nofollow

MAX_TREE_ENTRIES = 100_000


class DataError(ValueError):
    """A file below the directory that is not read: a link, not a regular file, over its limit; the message names
    it."""


class DataDir:
    """Reads below one directory; each method takes a path relative to it ('tests', 'tests/test.sh'). Refusals
    raise `error` (a subclass sets its own)."""

    error: type[Exception] = DataError

    def __init__(self, path: Path) -> None:
        self.path = path

    def kind(self, relative: str) -> str:
        """'file', 'dir' or 'missing'; a link (at any component) raises, any other kind of entry too."""
        parent, name = self._split(relative)
        try:
            with self._opened_dir(parent) as fd:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return "missing"
        return self._kind(self.path / relative, info.st_mode)

    def read_bytes(self, relative: str, limit: int) -> bytes:
        """The file's bytes; more than `limit` bytes is refused."""
        parent, name = self._split(relative)
        with self._opened_dir(parent) as parent_fd:
            try:
                fd = nofollow.open_file(parent_fd, name)
            except nofollow.NotRegular:
                raise self.error(f"{self.path / relative}: not a regular file") from None
            except OSError as error:
                raise self._refused(error, parent_fd, name, relative) from None
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise self.error(f"{self.path / relative}: over the limit of {limit} bytes")
        return data

    def files_under(self, relative: str) -> list[str]:
        """The regular files below the directory `relative` (relative to the task dir), sorted; a link or any
        other kind of entry anywhere below is refused."""
        found: list[str] = []
        for entry, kind in self.walk(relative):
            if kind == "file":
                found.append(entry)
        return sorted(found)

    def walk(self, relative: str) -> Iterator[tuple[str, str]]:
        """(path relative to the task dir, 'file' or 'dir') for every entry below `relative`, iteratively."""
        pending = [relative]
        seen = 0
        while pending:
            directory = pending.pop()
            with self._opened_dir(directory) as fd:
                names = sorted(os.listdir(fd))
                for name in names:
                    seen += 1
                    if seen > MAX_TREE_ENTRIES:
                        raise self.error(f"{self.path / relative}: more than {MAX_TREE_ENTRIES} entries")
                    entry = f"{directory}/{name}"
                    kind = self._kind(self.path / entry, os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                    if kind == "dir":
                        pending.append(entry)
                    yield entry, kind

    def copy_tree(self, relative: str, target: Path, *, limit_bytes: int) -> int:
        """Copy the directory `relative` into `target` (created), files and directories only, modes kept; returns
        the bytes copied; more than `limit_bytes` in all is refused."""
        target.mkdir(mode=0o755)
        total = 0
        for entry, kind in self.walk(relative):
            destination = target / entry.removeprefix(relative + "/")
            if kind == "dir":
                destination.mkdir(mode=0o755)
                continue
            data = self.read_bytes(entry, limit_bytes - total)
            total += len(data)
            destination.write_bytes(data)
            destination.chmod(0o755 if self.is_executable(entry) else 0o644)
        return total

    def is_executable(self, relative: str) -> bool:
        return bool(self.mode(relative) & stat.S_IXUSR)

    def mode(self, relative: str) -> int:
        """The entry's st_mode, the entry itself (a link is never followed)."""
        parent, name = self._split(relative)
        with self._opened_dir(parent) as fd:
            return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode

    def _kind(self, path: Path, mode: int) -> str:
        if stat.S_ISLNK(mode):
            raise self.error(_link(path))
        kind = _kind(path, mode)
        if kind is None:
            raise self.error(f"{path}: not a regular file or directory")
        return kind

    @staticmethod
    def _split(relative: str) -> tuple[str, str]:
        parts = [part for part in relative.split("/") if part not in ("", ".")]
        if not parts or ".." in parts:
            raise ValueError(f"not a path below the task dir: {relative!r}")
        return "/".join(parts[:-1]), parts[-1]

    @contextlib.contextmanager
    def _opened_dir(self, relative: str) -> Iterator[int]:
        parts = [part for part in relative.split("/") if part]
        top = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = nofollow.open_dir(top, parts)
        except nofollow.StepFailed as failed:
            raise self._walk_refused(failed, top, parts) from None
        finally:
            os.close(top)
        try:
            yield fd
        finally:
            os.close(fd)

    def _walk_refused(self, failed: nofollow.StepFailed, top: int, parts: list[str]) -> Exception:
        try:
            parent = nofollow.open_dir(top, parts[: failed.index])
        except nofollow.StepFailed:
            return failed.error
        try:
            return self._refused(failed.error, parent, parts[failed.index], "/".join(parts[: failed.index + 1]))
        finally:
            os.close(parent)

    def _refused(self, error: OSError, parent: int, name: str, relative: str) -> Exception:
        """What a failed open of `name` in `parent` is: a link (looked at again with lstat), not a directory, or
        the kernel's own error."""
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                return self.error(_link(self.path / relative))
        if isinstance(error, NotADirectoryError):
            return self.error(f"{self.path / relative}: not a directory")
        return error


def _kind(path: Path, mode: int) -> str | None:
    """'dir' or 'file'; None for anything else (a link, a FIFO, a device: the caller refuses it)."""
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return None


def _link(path: Path) -> str:
    return f"{path}: a symbolic link; task files are never read through links (copy the file in its place)"


def read_data_file(path: Path, limit: int, *, follow_link: bool = True) -> bytes:
    """A file named on its own (a request file, one found in a dataset folder) read as data: opened without
    blocking, a regular file only, at most `limit` bytes (DataError otherwise, naming it). `follow_link`: the
    operator named this path and may name it through a link; a file found in a folder is never read through one."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_link else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow_link:
            raise DataError(_link(path)) from None
        if error.errno == errno.ENXIO:
            raise DataError(f"{path}: not a regular file (a socket)") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise DataError(f"{path}: not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise DataError(f"{path}: over the limit of {limit} bytes")
    return data
