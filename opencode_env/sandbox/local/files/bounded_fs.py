"""A directory on a file system of its own, of a fixed size: an ext4 image file (sparse: it takes only the blocks
written) mounted through a loop device. What is written there can fill that file system, never the host's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def loop_devices_available() -> bool:
    return shutil.which("mkfs.ext4") is not None and Path("/dev/loop-control").exists()


def mount_existing(image: Path, mount_point: Path) -> bool:
    """Mount the file system `image` already holds on `mount_point` (nosuid, nodev)."""
    return _mount(image, mount_point).returncode == 0


def mount_bounded(image: Path, mount_point: Path, size_bytes: int, *, reserved_percent: int = 1) -> str | None:
    """Make `image` an empty ext4 file system of `size_bytes` (`reserved_percent` of it kept for root) and mount it
    on `mount_point` (nosuid, nodev); None when mounted, else why not (the image file is then removed)."""
    with os.fdopen(
        os.open(image, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb"
    ) as sparse:
        sparse.truncate(size_bytes)
    options = ["-q", "-F", "-m", str(reserved_percent), "-O", "^has_journal", "-E", "lazy_itable_init=1"]
    made = subprocess.run(["mkfs.ext4", *options, str(image)], capture_output=True, check=False)
    failure = made.stderr if made.returncode else None
    if failure is None:
        mounted = _mount(image, mount_point)
        failure = mounted.stderr if mounted.returncode else None
    if failure is not None:
        image.unlink(missing_ok=True)
        return failure.decode(errors="replace").strip() or "mkfs.ext4 or mount failed"
    shutil.rmtree(mount_point / "lost+found", ignore_errors=True)
    return None


def _mount(image: Path, mount_point: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["mount", "-o", "loop,nosuid,nodev", str(image), str(mount_point)], capture_output=True, check=False
    )
