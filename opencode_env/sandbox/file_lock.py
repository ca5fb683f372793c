"""Host-side locks on files their holders remove: a lock counts only while the file locked is still the one at its
path. Without that check a locker can open a file, lose the race to a holder that removes it and lets go, and then
hold a lock on a file nobody else sees, beside a second locker holding the file that took its name."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path
from typing import BinaryIO

from opencode_env.sandbox.base import SandboxError

REOPENS = 16
"""How often a locker that found its file replaced opens the new one before it counts the lock as held."""
POLL_S = 0.2
NOT_A_LOCK = {errno.ENOENT, errno.EISDIR, errno.ELOOP, errno.ENXIO}
"""What opening an existing lock finds where no lock is: nothing, a directory, a link, a socket."""


def try_lock(path: Path, *, create: bool = True, shared: bool = False) -> BinaryIO | None:
    """The lock on the file at `path` (made when `create`), or None when another holds it or, without `create`, when
    the file is gone or replaced (its holder removed it) or is not a regular file of this user's (a link, a
    directory, a pipe, another user's: nobody's lock). Closing the handle releases it."""
    for _ in range(REOPENS):
        try:
            fd = os.open(
                path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600
            )
        except OSError as error:
            if create or error.errno not in NOT_A_LOCK:
                raise
            return None
        handle = os.fdopen(fd, "r+b", buffering=0)
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode) or held.st_uid != os.geteuid():
            handle.close()
            if create:
                raise OSError(errno.EPERM, "not a regular file of this user's", str(path))
            return None
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        if _still_at(fd, path):
            return handle
        handle.close()
        if not create:
            return None
    return None


def wait_lock(path: Path, wait_s: float, *, shared: bool = False) -> BinaryIO:
    """The lock on `path` (made when missing), waited for at most `wait_s`: a thread never waits on another
    without a deadline."""
    deadline = time.monotonic() + wait_s
    while (handle := try_lock(path, shared=shared)) is None:
        if time.monotonic() > deadline:
            raise SandboxError(f"{path}: held by another process over {wait_s:g} s")
        time.sleep(POLL_S)
    return handle


def _still_at(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
