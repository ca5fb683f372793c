"""The unpacked image cache under rollouts at once (threads of one server, as asyncio.to_thread runs them): whatever
the interleaving, a tree a rollout decided to use stays whole until its holder lets go (a sandbox holds it for its
life), the budget's ledger charges exactly the trees on disk, and the record of loaded archives
keeps every archive and stays readable. Real threads race the real store and budget; only podman is faked (its
answers and the copy of an image's files), as in the race audit's scripts."""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.local.images import budget as budget_module
from opencode_env.sandbox.local.images import store as store_module
from opencode_env.sandbox.local.images.budget import BudgetExceeded, ImageBudget
from opencode_env.sandbox.local.images.store import ImageStore
from tests.helpers import beside_a_loop

pytestmark = pytest.mark.timeout(300)

FILES = 400
"""Files in each fake image: enough that removing a tree takes a while, as a real one's does."""
WHOLE = FILES + 2
"""Entries of a whole unpacked tree: the files, /bin (with sh) and the /etc the store adds its accounts to."""
SIZE = 60
LIMIT = 100
"""The budget: room for one image's tree, so unpacking a second must evict the first."""
ARCHIVED = "c" * 64
"""The image every fake archive loads as."""


def _image_id(ref: str) -> str:
    if ref.startswith("localhost/archive-"):
        return ARCHIVED
    return hashlib.sha256(ref.encode()).hexdigest()


def _fake_podman(*args: str, timeout_s: float = 0) -> subprocess.CompletedProcess[str]:
    """podman's answers for images that are all in storage (the trees' ids are not: prune finds them dropped)."""
    if args[:2] == ("image", "inspect"):
        described = [{"Id": f"sha256:{_image_id(args[-1])}", "Size": SIZE, "Config": {"Env": ["A=1"]}}]
        return subprocess.CompletedProcess(args, 0, json.dumps(described), "")
    if args[:2] == ("image", "exists"):
        return subprocess.CompletedProcess(args, 1 if len(args[-1]) == 64 else 0, "", "")
    if args[0] == "load":
        time.sleep(random.uniform(0, 0.002))
        return subprocess.CompletedProcess(args, 0, f"Loaded image: localhost/archive-{Path(args[-1]).name}\n", "")
    raise AssertionError(f"unexpected podman call {args}")


def _fake_copy(image_id: str, target: Path) -> None:
    for index in range(FILES):
        (target / f"f{index}").write_bytes(b"x")
    (target / "bin").mkdir()
    (target / "bin" / "sh").write_bytes(b"")


@pytest.fixture(autouse=True)
def fake_podman(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_podman", lambda: "/fake/podman")
    monkeypatch.setattr(store_module, "_run_podman", _fake_podman)
    monkeypatch.setattr(store_module, "_copy_image_tree", _fake_copy)


def _whole(rootfs: Path) -> int:
    """How many entries the tree has (WHOLE when whole; -1 when gone)."""
    return len(list(rootfs.iterdir())) if rootfs.is_dir() else -1


def _ledger_matches_disk(root: Path, budget: ImageBudget, *, all_charged: bool = True) -> list[str]:
    """What is wrong with the cache once its users are done: a charge for a tree that is not there (or, when every
    user charges, a tree not charged), a tree taken or staged and never removed."""
    charged = {key for key, charge in budget.charged().items() if charge.kind == "tree"}
    complete = {tree.name for tree in root.iterdir() if (tree / ".complete").exists()}
    leftovers = sorted(path.name for path in root.glob("*") if path.name.startswith(".pruned-"))
    leftovers += sorted(path.name for path in root.glob("*/.rootfs-*"))
    problems = []
    if not charged <= complete or (all_charged and charged != complete):
        problems.append(f"ledger charges {sorted(charged)} but the complete trees are {sorted(complete)}")
    if leftovers:
        problems.append(f"left behind: {leftovers}")
    return problems


def _eviction_trial(root: Path, arrive_while_evicting: bool) -> list[str]:
    """A rollout on X (unpacked, charged) and a rollout on Y (whose unpack must evict X) at once; the first holds X
    for a while before its mount (make_layout, the uid lease, own_tree), then checks the tree is whole. Arriving
    while X is evicted, the rollout on X comes through a store of the same cache that charges no budget (a cluster
    node's, cluster/node.py): one that charges waits on the ledger the evictor holds, which hides the window."""
    budget = ImageBudget(root, LIMIT)
    store = ImageStore(root, budget=budget, progress=lambda _: None)
    store.prepare("refX")
    store_of_x = ImageStore(root, progress=lambda _: None) if arrive_while_evicting else store
    complete = root / _image_id("refX") / ".complete"
    problems: list[str] = []
    evicting_done = threading.Event()

    def on_y() -> None:
        try:
            store.prepare("refY")
        except BudgetExceeded:
            pass  # X held: Y does not fit beside it, the task's own error
        except Exception as error:  # an interleaving's failure, reported with the rest
            problems.append(f"the rollout on Y: {error!r}")
        finally:
            evicting_done.set()

    def on_x() -> None:
        try:
            if arrive_while_evicting:
                while complete.exists() and not evicting_done.is_set():
                    pass
            with store_of_x.hold("refX") as image:
                time.sleep(0.05)
                if (entries := _whole(image.rootfs)) != WHOLE:
                    problems.append(f"the rollout on X: its tree at mount time has {entries} entries")
        except BudgetExceeded:
            pass
        except Exception as error:
            problems.append(f"the rollout on X: {error!r}")

    threads = [threading.Thread(target=on_x), threading.Thread(target=on_y)]
    threads[0].start()
    if not arrive_while_evicting:
        time.sleep(random.uniform(0, 0.01))
    threads[1].start()
    for thread in threads:
        thread.join(60)
    return problems + _ledger_matches_disk(root, budget, all_charged=not arrive_while_evicting)


@pytest.mark.parametrize("arrive_while_evicting", [False, True], ids=["held-then-evicted", "arrives-mid-eviction"])
def test_a_tree_a_rollout_holds_is_never_evicted_before_its_mount(tmp_path: Path, arrive_while_evicting: bool) -> None:
    """Over interleavings of a rollout about to mount X and another whose unpack evicts X: X's holder always finds
    its tree whole (or the other rollout does not fit beside it), never an internal error, and the ledger ends
    charging exactly the trees on disk."""
    failed = {}
    for trial in range(20):
        if problems := _eviction_trial(tmp_path / f"trial-{trial}", arrive_while_evicting):
            failed[trial] = problems
    assert failed == {}


def test_a_prune_never_removes_a_tree_a_rollout_holds(tmp_path: Path) -> None:
    """Prunes in a loop (every tree's image dropped from storage) beside rollouts holding the tree until their
    mount: each holder finds its tree whole through its hold; the prunes never fail."""
    store = ImageStore(tmp_path, progress=lambda _: None)
    problems: list[str] = []

    def pruning() -> None:
        try:
            store.prune()
        except Exception as error:
            problems.append(f"prune: {error!r}")
        time.sleep(random.uniform(0, 0.005))

    def holding(_: int) -> None:
        for _round in range(10):
            try:
                with store.hold("refX") as image:
                    time.sleep(random.uniform(0, 0.02))
                    if (entries := _whole(image.rootfs)) != WHOLE:
                        problems.append(f"held tree has {entries} entries")
            except Exception as error:
                problems.append(f"hold: {error!r}")

    beside_a_loop(pruning, holding, count=4, workers=4)
    assert problems == []


def test_a_preparer_that_waited_on_a_tree_taken_meanwhile_starts_over(tmp_path: Path) -> None:
    """An evictor holds X's lock while a rollout comes for X, then renames the tree away and lets go: the rollout
    never takes the lock of the renamed tree; it gets a fresh whole one, held (X cannot be evicted until released)."""
    budget = ImageBudget(tmp_path, LIMIT)
    store = ImageStore(tmp_path, budget=budget, progress=lambda _: None)
    directory = store.prepare("refX").rootfs.parent
    got: list[Any] = []
    with (directory / ".lock").open("r+b") as evicting:
        fcntl.flock(evicting, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: got.append(_catch(lambda: store.hold("refX"))))
        waiter.start()
        time.sleep(0.5)
        budget.release(directory.name)  # as the evictor's ledger does, before anyone can charge the tree again
        (directory / ".complete").unlink()
        directory.rename(tmp_path / f".pruned-{directory.name}-0-0")
    shutil.rmtree(tmp_path / f".pruned-{directory.name}-0-0")
    waiter.join(30)
    [held] = got
    assert not isinstance(held, BaseException), held
    assert _whole(held.image.rootfs) == WHOLE
    with pytest.raises(BudgetExceeded):
        budget.charge("tree", "d" * 64, SIZE, what="another image")
    held.release()
    budget.charge("tree", "d" * 64, SIZE, what="another image")
    assert not directory.exists(), "released, the tree is evicted like any other"


def _catch(call: Callable[[], object]) -> object:
    try:
        return call()
    except BaseException as error:
        return error


def test_archives_loaded_at_once_are_all_recorded(tmp_path: Path) -> None:
    """Rollouts whose archives finish loading at once each record theirs: none fails on another's write, none is
    lost, and the record stays valid JSON."""
    archives = tmp_path / "archives"
    archives.mkdir()
    paths = [archives / f"task-{index}.tar" for index in range(160)]
    for path in paths:
        path.write_bytes(b"archive")
    store = ImageStore(tmp_path / "images", archive_dir=archives, progress=lambda _: None)
    failures: list[str] = []

    def prepare(path: Path) -> None:
        try:
            store.prepare(f"oci-archive:{path}")
        except Exception as error:
            failures.append(repr(error))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(prepare, paths))
    recorded = json.loads((tmp_path / "images" / "loaded.json").read_text())
    assert failures == []
    assert sorted(recorded.values()) == sorted(f"localhost/archive-{path.name}" for path in paths)


def test_a_loaded_record_that_does_not_parse_counts_as_empty_and_is_rewritten(tmp_path: Path) -> None:
    archives = tmp_path / "archives"
    archives.mkdir()
    (archives / "task.tar").write_bytes(b"archive")
    root = tmp_path / "images"
    root.mkdir()
    (root / "loaded.json").write_text('{"torn": "localhost/a')
    store = ImageStore(root, archive_dir=archives, progress=lambda _: None)
    assert store.prepare(f"oci-archive:{archives / 'task.tar'}").image_id == f"sha256:{ARCHIVED}"
    assert list(json.loads((root / "loaded.json").read_text()).values()) == ["localhost/archive-task.tar"]


def test_a_ledger_held_past_its_deadline_names_its_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget_module, "LOCK_WAIT_S", 0.3)
    budget = ImageBudget(tmp_path, LIMIT)
    with (tmp_path / "budget.json.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(SandboxError, match=r"budget\.json\.lock: held by another process over 0\.3 s"):
            budget.charge("tree", "e" * 64, SIZE, what="an image")
