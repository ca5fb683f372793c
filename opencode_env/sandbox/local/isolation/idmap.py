"""An id-mapped view of a directory tree (Linux 5.12+): the files an image holds, owned by in-sandbox uid N, are
seen there as owned by host uid `first + N`, the rollout's own, without copying or changing a single file.

The mapping comes from a user namespace made for the purpose (a child of unshare(1), whose map this root process
writes, then ends); the view is a detached clone of the tree (open_tree) marked id-mapped (mount_setattr) and
moved into place (move_mount). Syscall numbers are the same on every architecture for these calls.
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
from pathlib import Path

from opencode_env.sandbox.base import SandboxError

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_IDMAP = 0x00100000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
NAMESPACE_START_S = 10.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args: object) -> int:
    result = int(_libc.syscall(number, *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def _mapping_namespace(first: int, count: int) -> int:
    """A descriptor of a user namespace mapping uids and gids 0..count-1 to first..first+count-1."""
    with subprocess.Popen(
        ["unshare", "--user", "--", "/bin/sh", "-c", "echo ready && exec sleep 60"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as child:
        try:
            assert child.stdout is not None
            if child.stdout.readline().strip() != b"ready":
                raise SandboxError("could not make a user namespace for an id-mapped image")
            for name in ("uid_map", "gid_map"):
                Path(f"/proc/{child.pid}/{name}").write_text(f"0 {first} {count}\n")
            return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            child.kill()
            child.wait(NAMESPACE_START_S)


def mount_idmapped(source: Path, target: Path, *, first: int, count: int) -> None:
    """Mount `source` read-only at `target`, its uid and gid N seen as first + N (N < count)."""
    namespace = _mapping_namespace(first, count)
    try:
        tree = _syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(source), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
        try:
            attributes = struct.pack("QQQQ", MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, 0, 0, namespace)
            buffer = ctypes.create_string_buffer(attributes, len(attributes))
            _syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, buffer, len(attributes))
            _syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH)
        finally:
            os.close(tree)
    except OSError as error:
        raise SandboxError(f"could not mount {source} id-mapped (Linux 5.12 or newer is needed): {error}") from error
    finally:
        os.close(namespace)
