"""The one link-safe way we open a path we do not trust: one component at a time, each relative to the descriptor of
the one before and with O_NOFOLLOW, so a symlink planted at any component (or swapped in while we walk) is never
followed; a file is opened O_NONBLOCK (a FIFO swapped in cannot block) and kept only when fstat says it is regular.
The host's walkers (sandbox/local/files/hostfs.py, data_dir.py) and the work dir's carrier (sandbox/tree_carry.py, run
inside cloud sandboxes too) open through it. Standard library only; Python 3.8 or newer."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
Step = Callable[[int, str], int]


class StepFailed(Exception):
    """Opening component `index` of a walk failed with `error` (ELOOP: a link; ENOTDIR: not a directory; ENOENT...)."""

    def __init__(self, error: OSError, index: int) -> None:
        super().__init__(f"component {index}: {error}")
        self.error, self.index = error, index


class NotRegular(OSError):
    """The entry opened is not a regular file."""

    def __init__(self) -> None:
        super().__init__(errno.EINVAL, "not a regular file")


def open_dir(start: int, parts: Sequence[str], step: Step | None = None) -> int:
    """A new descriptor of the directory `start`/parts...; `start` stays open and the caller's. Each component is
    opened by `step(directory, name)` (None: `open_step`; a writer's step may make what is missing). A failing
    component raises StepFailed (its index, the error), and nothing opened on the way stays open."""
    fd = os.dup(start)
    try:
        for index, part in enumerate(parts):
            try:
                child = (step or open_step)(fd, part)
            except OSError as error:
                raise StepFailed(error, index) from error
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_step(directory: int, name: str) -> int:
    """The directory `name` in `directory`, never through a link."""
    return os.open(name, DIR_FLAGS, dir_fd=directory)


def open_file(parent: int, name: str) -> int:
    """A descriptor of the regular file `name` in the directory `parent`: OSError as the kernel says it (ELOOP for a
    link, ENXIO for a socket), NotRegular for anything else that is not a regular file."""
    fd = os.open(name, FILE_FLAGS, dir_fd=parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular()
    except BaseException:
        os.close(fd)
        raise
    return fd
