"""One budget for what task images leave on the host (the images we build, in podman's storage, and the unpacked
image cache), with small budgets and real builds in the box: an image over it fails as the task's error and never
reaches podman's storage; past it the least recently used image or tree is evicted, never one in use."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from opencode_env.sandbox.local.images.budget import BudgetExceeded, ImageBudget
from opencode_env.sandbox.local.images.build.builder import ImageBuilder, ImageBuildError
from opencode_env.sandbox.local.images.store import ImageStore, image_exists
from tests.integration.test_images import busybox_image  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def built(tmp_path: Path) -> Iterator[list[str]]:
    """The refs this test built, removed after it."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        subprocess.run(["podman", "rmi", "--force", "--", ref], check=False, capture_output=True)


def _context(root: Path, base: str, name: str) -> Path:
    context = root / name / "environment"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text(f"FROM {base}\nRUN busybox echo {name} > /{name}\n")
    return context


def _build(builder: ImageBuilder, context: Path, refs: list[str]) -> str:
    ref = builder.build(context, name=context.parent.name, timeout_s=600).ref
    refs.append(ref)
    return ref


def _archive_size(image: str, root: Path) -> int:
    archive = root / "size-probe.tar"
    subprocess.run(["podman", "save", "-q", "-o", str(archive), "--", image], check=True, capture_output=True)
    size = archive.stat().st_size
    archive.unlink()
    return size


def test_a_built_image_over_the_budget_fails_its_task_and_never_reaches_storage(
    tmp_path: Path,
    busybox_image: str,  # noqa: F811
    built: list[str],
) -> None:
    budget = ImageBudget(tmp_path / "images", 64 << 10)
    context = _context(tmp_path, busybox_image, f"over-{os.getpid()}-{os.urandom(3).hex()}")
    with pytest.raises(ImageBuildError) as failed:
        _build(ImageBuilder(budget=budget), context, built)
    message = str(failed.value)
    assert "over the image storage budget of 0.1 MiB (OPENCODE_ENV_IMAGE_STORAGE_MB)" in message
    ref = message.split("the built image ", 1)[1].split(" is ", 1)[0]
    assert not image_exists(ref)
    assert budget.charged() == {}


def test_past_the_budget_the_least_recently_used_built_image_is_evicted(
    tmp_path: Path,
    busybox_image: str,  # noqa: F811
    built: list[str],
) -> None:
    size = _archive_size(busybox_image, tmp_path)
    budget = ImageBudget(tmp_path / "images", int(2.5 * size))
    builder = ImageBuilder(budget=budget)
    tag = f"{os.getpid()}-{os.urandom(3).hex()}"
    first, second = (_build(builder, _context(tmp_path, busybox_image, f"{n}-{tag}"), built) for n in ("a", "b"))
    assert _build(builder, _context(tmp_path / "again", busybox_image, f"a-{tag}"), built) == first  # used: newest
    third = _build(builder, _context(tmp_path, busybox_image, f"c-{tag}"), built)
    assert image_exists(first)
    assert not image_exists(second), "the least recently used image makes room"
    assert image_exists(third)
    assert sorted(budget.charged()) == sorted([first, third])


def test_past_the_budget_an_unpacked_tree_is_evicted_unless_in_use(
    tmp_path: Path,
    busybox_image: str,  # noqa: F811
    built: list[str],
) -> None:
    builder, tag = ImageBuilder(budget=ImageBudget(tmp_path / "builds", 1 << 40)), os.urandom(3).hex()
    first, second, third = (
        _build(builder, _context(tmp_path, busybox_image, f"{n}-{tag}"), built) for n in ("tree-a", "tree-b", "tree-c")
    )
    inspect = ["podman", "image", "inspect", "--format", "{{.Size}}", "--", first]
    described = subprocess.run(inspect, capture_output=True, check=True)
    root = tmp_path / "images"
    store = ImageStore(root, budget=ImageBudget(root, int(1.5 * int(described.stdout))))
    a = store.prepare(first)
    b = store.prepare(second)
    assert not a.rootfs.exists(), "the first tree made room for the second"
    assert b.rootfs.exists()
    with (b.rootfs.parent / ".lock").open("w") as held:  # another process unpacking or pruning it: in use
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(BudgetExceeded, match=r"does not fit in the image storage budget of .* beside the"):
            store.prepare(third)
    assert b.rootfs.exists()
    assert store.prepare(third).rootfs.exists(), "once nothing holds it, the older tree makes room"
    assert not b.rootfs.exists()
