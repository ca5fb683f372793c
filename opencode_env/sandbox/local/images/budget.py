"""One budget for everything task images leave on this machine: the task images we build, in podman's storage (their
archives' size), and the unpacked image cache (each tree at its image's size). A ledger beside the cache records
each charge and when it was last used; making room evicts the least recently used charge that is not in use (a
tree a rollout has mounted or holds to mount, or another process is unpacking, stays: take_tree), and a charge that
cannot fit is the task's error.

The build box's own file system is bounded apart (build/box.py); an image the operator put in podman's storage is never
charged or evicted, only ours (`TASK_REPOSITORY`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.file_lock import try_lock, wait_lock

TASK_REPOSITORY = "localhost/opencode-env-task"
LEDGER = "budget.json"
LOCK_WAIT_S = 1800.0
"""The longest a charge waits for another one (which may be evicting: podman rmi, removing a tree)."""
RMI_TIMEOUT_S = 120.0
SETTING = "OPENCODE_ENV_IMAGE_STORAGE_MB"
PRUNED_PREFIX = ".pruned-"
"""In the cache: a tree an evictor or a pruner took (`.pruned-<tree>-<pid>-<n>`), removed by it or, once its process
is gone, by the next prune."""
Kind = Literal["image", "tree"]


class BudgetExceeded(SandboxError):
    """An image does not fit in the image storage budget (alone, or beside what is in use)."""


@dataclass
class Charge:
    kind: Kind
    key: str
    """The image's reference (an image in podman's storage) or its id (a tree in the cache)."""
    size: int
    used: float


def megabytes(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def mounted_sources() -> set[str]:
    """The source paths of this mount namespace's mounts (/proc/self/mountinfo's fourth field: the root of the
    mount within its file system, which for an id-mapped view of an unpacked image is that image's tree)."""
    return {line.split(" ")[3] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


class ImageBudget:
    """The ledger at `root` (the unpacked image cache's directory), of `limit_bytes` in all."""

    def __init__(self, root: Path, limit_bytes: int, *, podman: str | None = None) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self.podman = podman or shutil.which("podman") or "podman"

    def charge(self, kind: Kind, key: str, size: int, *, what: str, keep: tuple[str, ...] = ()) -> None:
        """Record `size` bytes for `key` (used now), evicting the least recently used charges not in use (nor in
        `keep`: what this charge is made from) to make room; BudgetExceeded (naming `what`) when it cannot fit."""
        if size > self.limit_bytes:
            raise BudgetExceeded(
                f"{what} is {megabytes(size)}, over the image storage budget of {megabytes(self.limit_bytes)} "
                f"({SETTING})"
            )
        with self._ledger() as charges:
            charges.pop(key, None)
            total = sum(charge.size for charge in charges.values())
            for charge in sorted(charges.values(), key=lambda charge: charge.used):
                if total + size <= self.limit_bytes:
                    break
                if charge.key not in keep and self._evict(charge):
                    total -= charge.size
                    del charges[charge.key]
            if total + size > self.limit_bytes:
                raise BudgetExceeded(
                    f"{what} ({megabytes(size)}) does not fit in the image storage budget of "
                    f"{megabytes(self.limit_bytes)} ({SETTING}) beside the {megabytes(total)} in use now"
                )
            charges[key] = Charge(kind, key, size, time.time())

    def use(self, kind: Kind, key: str, size: int, *, what: str) -> None:
        """`key` used now: its charge made the most recent (charged first when the ledger does not hold it)."""
        with self._ledger() as charges:
            if key in charges:
                charges[key].used = time.time()
                return
        self.charge(kind, key, size, what=what)

    def touch(self, key: str) -> None:
        """`key` used now, when the ledger holds it."""
        with self._ledger() as charges:
            if key in charges:
                charges[key].used = time.time()

    def release(self, key: str) -> None:
        """`key`'s charge dropped (what it stood for was not made, or was removed)."""
        with self._ledger() as charges:
            charges.pop(key, None)

    def charged(self) -> dict[str, Charge]:
        with self._ledger() as charges:
            return dict(charges)

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[dict[str, Charge]]:
        self.root.mkdir(parents=True, exist_ok=True)
        with wait_lock(self.root / f"{LEDGER}.lock", LOCK_WAIT_S):
            path = self.root / LEDGER
            try:
                stored = json.loads(path.read_text())
            except FileNotFoundError:
                stored = []
            charges = {item["key"]: Charge(**item) for item in stored}
            yield charges
            staging = path.with_name(f".{LEDGER}.{os.getpid()}")
            staging.write_text(json.dumps([asdict(charge) for charge in charges.values()]))
            staging.replace(path)

    def _evict(self, charge: Charge) -> bool:
        """Remove what `charge` stands for, unless it is in use; True when it is gone."""
        if charge.kind == "image":
            if not charge.key.startswith(f"{TASK_REPOSITORY}/"):
                return False
            removed = subprocess.run(
                [self.podman, "rmi", "--", charge.key], capture_output=True, timeout=RMI_TIMEOUT_S, check=False
            )
            gone = subprocess.run(
                [self.podman, "image", "exists", "--", charge.key], capture_output=True, timeout=60, check=False
            )
            return removed.returncode == 0 or gone.returncode == 1
        return self._evict_tree(charge.key)

    def _evict_tree(self, image_id: str) -> bool:
        directory = self.root / image_id.removeprefix("sha256:")[:64]
        if not directory.is_dir():
            return True
        doomed = take_tree(directory)
        if doomed is None:
            return not directory.is_dir()  # in use, or another evictor or pruner took it first
        shutil.rmtree(doomed)
        return True


def take_tree(directory: Path, *, taken: Callable[[], None] | None = None) -> Path | None:
    """The unpacked image tree at `directory` taken for removal, unless it is in use: its `.lock` held exclusively,
    never waited for (a holder is unpacking it, or is a rollout using it: see ImageStore.hold), and, while held, no
    mount of it in the mount table (a sandbox of a server that died before its reaper ran). Under that lock the
    directory is renamed to a name of the taker's, which is returned for the caller to remove outside the lock: a
    preparer that was waiting on the lock then finds no tree there and starts over, never one half removed. None
    when in use or already gone. `taken` runs once the tree is renamed, still under the lock (a pruner drops the
    tree's charge there, before a preparer can make the tree and charge it again)."""
    try:
        lock = try_lock(directory / ".lock")
    except (FileNotFoundError, NotADirectoryError):
        return None  # taken (renamed away) by another evictor or pruner
    if lock is None:
        return None
    with lock:
        rootfs = str(directory / "rootfs")
        if any(source == rootfs or source.startswith(rootfs + "/") for source in mounted_sources()):
            return None
        (directory / ".complete").unlink(missing_ok=True)
        doomed = directory.with_name(f"{PRUNED_PREFIX}{directory.name}-{os.getpid()}-{time.monotonic_ns()}")
        directory.rename(doomed)
        if taken is not None:
            taken()
    return doomed
