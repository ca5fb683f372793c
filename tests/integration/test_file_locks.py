"""Locks on files their holders remove (a rollout's uid block, a rollout tree's owner lock): whatever the
interleaving of lockers and holders, no two hold one at once and a tree is never taken from a live owner. Real
threads race the real code; what is narrowed is only the choice (two uid slots instead of 16,384)."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opencode_env.sandbox.file_lock import try_lock, wait_lock
from opencode_env.sandbox.local import layout
from opencode_env.sandbox.local.isolation import host_ids
from opencode_env.sandbox.local.isolation.bubblewrap import Layout
from opencode_env.sandbox.local.isolation.host_ids import UidLease
from tests.helpers import beside_a_loop

pytestmark = pytest.mark.timeout(120)
NOBODY = 65534


def test_a_uid_block_is_never_leased_twice_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease removes its slot's file as it ends; a leaser that opened the file just before must not hold the
    removed one beside the leaser that made the next."""
    monkeypatch.setattr(host_ids, "UID_SLOTS", 2)
    live: Counter[int] = Counter()
    guard = threading.Lock()
    doubles = []

    def lease_and_release(_: int) -> None:
        try:
            lease = UidLease(tmp_path)
        except RuntimeError:
            return
        with guard:
            live[lease.ids.root] += 1
            if live[lease.ids.root] > 1:
                doubles.append(lease.ids.root)
        time.sleep(0.0002)
        with guard:
            live[lease.ids.root] -= 1
        lease.release()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lease_and_release, range(10_000)))
    assert doubles == []


def test_a_closing_rollouts_tree_is_never_reaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reaper beside owners that remove their trees (lock held) and then let go: it never takes a live tree, and
    an owner's removal never fails on what a reaper did."""
    monkeypatch.setattr(layout, "detect", lambda: None)
    logging.getLogger("opencode_env.local").setLevel(logging.ERROR)
    reaped: list[str] = []

    def reap() -> None:
        reaped.extend(layout.reap_orphans(tmp_path))

    def own_and_close(_: int) -> None:
        root = Path(tempfile.mkdtemp(prefix=layout.PREFIX, dir=tmp_path))
        owner = layout.OwnerLock(Layout(root))
        (root / "fs" / "d").mkdir(parents=True)
        (root / "fs" / "d" / "f").write_bytes(b"x")
        try:
            layout.remove_rollout(Layout(root))
        finally:
            owner.release()

    beside_a_loop(reap, own_and_close, count=1500, workers=2)
    assert reaped == []
    assert list(tmp_path.iterdir()) == []


def test_a_lock_is_refused_through_a_link_and_released_on_close(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        try_lock(tmp_path / "link")
    assert try_lock(tmp_path / "missing", create=False) is None
    with wait_lock(tmp_path / "lock", wait_s=1):
        assert try_lock(tmp_path / "lock") is None
        assert try_lock(tmp_path / "lock", shared=True) is None
    first, second = try_lock(tmp_path / "lock", shared=True), try_lock(tmp_path / "lock", shared=True)
    assert first is not None
    assert second is not None
    assert try_lock(tmp_path / "lock") is None
    first.close()
    second.close()
    again = try_lock(tmp_path / "lock", create=False)
    assert again is not None
    again.close()


PLANTS = ["link to /", "link to a lock of ours", "directory", "fifo", "socket", "another user's file"]


def _plant(lock: Path, kind: str, elsewhere: Path) -> None:
    if kind == "link to /":
        lock.symlink_to("/")
    elif kind == "link to a lock of ours":
        (elsewhere / "ours.lock").write_bytes(b"")
        lock.symlink_to(elsewhere / "ours.lock")
    elif kind == "directory":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "socket":
        with tempfile.TemporaryDirectory() as short, socket.socket(socket.AF_UNIX) as bound:
            bound.bind(f"{short}/s")  # a socket's path has a short bound: made there, then moved
            os.rename(f"{short}/s", lock)
    else:
        lock.write_bytes(b"")
        os.chown(lock, NOBODY, NOBODY)


@pytest.mark.parametrize("owner", ["ours", "another user's"])
def test_the_reaper_takes_nothing_it_did_not_make(tmp_path: Path, owner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone may make directories named like our trees in a shared /tmp: whatever is planted where a tree's lock
    would be, in a directory of ours or of another user's, the reaper neither fails nor takes it; a real orphan
    beside them is still reaped."""
    monkeypatch.setattr(layout, "detect", lambda: None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "base"
    base.mkdir()
    planted = []
    for n, kind in enumerate(PLANTS):
        root = base / f"{layout.PREFIX}planted{n}"
        root.mkdir()
        _plant(root / layout.OWNER_LOCK, kind, elsewhere)
        if owner != "ours":
            os.chown(root, NOBODY, NOBODY)
        planted.append(root)
    stranger = base / f"{layout.PREFIX}stranger"
    stranger.mkdir()
    (stranger / layout.OWNER_LOCK).write_bytes(b"")
    os.chown(stranger, NOBODY, NOBODY)
    orphan = base / f"{layout.PREFIX}orphan"
    orphan.mkdir()
    (orphan / layout.OWNER_LOCK).write_bytes(b"")
    assert layout.reap_orphans(base) == [orphan.name]
    assert all(os.path.lexists(root / layout.OWNER_LOCK) for root in [*planted, stranger])
    assert (elsewhere / "ours.lock").exists()
