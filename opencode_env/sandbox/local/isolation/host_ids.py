"""The host uids a local rollout runs as: one block of unprivileged host uids per rollout, leased exclusively on the
machine for the rollout's life (see command_argv.py for how commands drop to them)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from opencode_env.sandbox.base import Identity
from opencode_env.sandbox.file_lock import try_lock

SANDBOX_UID = 1000
GRADER_UID = 1001
UID_BASE = 2_000_000_000
UIDS_PER_SLOT = 1 << 17
UID_SLOTS = 16_384
IMAGE_UIDS = 1 << 16
"""In-sandbox uids 0..65535 are the host uids `root`..`root + 65535` of the rollout: an image's files, owned by any
of them, keep their owners inside (its root's are the sandbox root's), and none is any other rollout's."""
UID_REGISTRY = Path("/run/opencode-env/uids")


@dataclass(frozen=True)
class HostIds:
    """The unprivileged host uids of one rollout: its in-sandbox root (also the proxy's), whose block of IMAGE_UIDS
    holds every in-sandbox uid (`user` is root + 1000, the grader root + 1001), and OpenCode, outside that block."""

    root: int

    @classmethod
    def of_slot(cls, slot: int) -> HostIds:
        return cls(root=UID_BASE + UIDS_PER_SLOT * slot)

    @property
    def user(self) -> int:
        return self.root + SANDBOX_UID

    @property
    def grader(self) -> int:
        return self.root + GRADER_UID

    @property
    def agent(self) -> int:
        return self.root + IMAGE_UIDS

    def of(self, identity: Identity) -> int:
        return {"user": self.user, "root": self.root, "agent": self.agent, "grader": self.grader}[identity]


class UidLease:
    """Four host uids held for one rollout; a lock file makes them exclusive on the machine, and they are released
    when the process holding them ends, however it ends."""

    def __init__(self, registry: Path = UID_REGISTRY) -> None:
        registry.mkdir(parents=True, exist_ok=True, mode=0o700)
        for _ in range(64):
            slot = random.randrange(UID_SLOTS)
            path = registry / str(slot)
            handle = try_lock(path)
            if handle is not None:
                self._path, self._handle = path, handle
                self.ids = HostIds.of_slot(slot)
                return
        raise RuntimeError("no free host uid pair for a sandbox")

    def release(self) -> None:
        """The slot's file goes while it is held (a locker that opened it finds it replaced and tries again)."""
        try:
            self._path.unlink(missing_ok=True)
        finally:
            self._handle.close()
