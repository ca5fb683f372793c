"""Images on the local backend: an image's root file system as the sandbox's root (an id-mapped overlay), the same
identities and isolation as without one, OpenCode and our helpers from the host even where the image has no libc,
images from podman's storage and from OCI archives, and the base image a request naming none runs on."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.sandbox.base import SandboxError, SandboxSpec
from opencode_env.sandbox.local import layout
from opencode_env.sandbox.local.backend import LocalBackend, LocalSandbox
from opencode_env.sandbox.local.images import budget
from opencode_env.sandbox.local.images.base_image import build_base_image
from opencode_env.sandbox.local.images.store import ImageStore
from opencode_env.sandbox.local.isolation.host_ids import UID_BASE
from opencode_env.sandbox.local.isolation.host_runtime import HOST_MOUNT
from opencode_env.sandbox.local.tools import cache_root, cached_tools
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from tests.helpers import RUN_MARK, rollout

BUSYBOX_IMAGE = f"localhost/opencode-env-test/busybox:{os.getpid()}"
"""One tag per test process: xdist's workers each make and remove their own."""
BUSYBOX_APPLETS = ("sh", "ls", "cat", "echo", "test", "grep", "mkdir", "chown", "id", "env", "touch", "stat", "rm")


@pytest.fixture(scope="session")
def base_image() -> str:
    return build_base_image()


@pytest.fixture(scope="session")
def busybox_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An image of one statically linked busybox: no libc, no Python, no Node."""
    busybox = Path("/bin/busybox")
    described = subprocess.run(["file", "-L", str(busybox)], capture_output=True, text=True, check=False).stdout
    if not busybox.exists() or "statically linked" not in described:
        pytest.skip("needs busybox-static (./dev setup installs it)")
    archive = tmp_path_factory.mktemp("busybox") / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        for directory in ("bin", "tmp", "etc", "root"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, "bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    # an image id of its own: another worker's `podman rmi --force` of an identical image would remove this one too
    own_id = ["--change", f"LABEL opencode-env-test={BUSYBOX_IMAGE}-{RUN_MARK}"]
    subprocess.run(
        ["podman", "import", "--quiet", "--change", "ENV PATH=/bin", *own_id, str(archive), BUSYBOX_IMAGE],
        check=True,
        capture_output=True,
    )
    yield BUSYBOX_IMAGE
    subprocess.run(["podman", "rmi", "--force", BUSYBOX_IMAGE], check=False, capture_output=True)
    ImageStore(cache_root() / "images").prune()


@pytest.fixture
async def image_box(backend: LocalBackend, base_image: str) -> AsyncIterator[LocalSandbox]:
    sandbox = await backend.create(SandboxSpec(image=base_image))
    try:
        yield sandbox
    finally:
        await sandbox.close()


async def _sh(sandbox: LocalSandbox, cmd: str, identity: str = "user") -> str:
    result = await sandbox.run(cmd, timeout_s=60, cwd="/", identity=identity)  # type: ignore[arg-type]
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


async def test_each_identity_in_an_image(image_box: LocalSandbox) -> None:
    assert await _sh(image_box, "id -u; id -g") == "1000\n1000"
    assert (await _sh(image_box, "cat /etc/os-release")).startswith('PRETTY_NAME="Debian GNU/Linux 12')
    assert await _sh(image_box, "stat -c '%u %U' /usr/bin/python3", "root") == "0 root"
    await _sh(image_box, "touch /usr/local/bin/made-by-root && stat -c %U /usr/local/bin/made-by-root", "root")
    refused = await image_box.run("touch /usr/local/bin/made-by-user", timeout_s=60, cwd="/")
    assert refused.exit_code != 0
    assert "Permission denied" in refused.stderr
    assert await _sh(image_box, "id -u; echo $HOME; touch /tmp/x", "grader") == "1001\n/home/grader/home"


async def test_in_image_root_is_an_unprivileged_host_uid(image_box: LocalSandbox) -> None:
    """The image's root-owned files are the rollout's own host uid, outside every host account; what root changes
    lands in the rollout's overlay, never in the cached image."""
    await _sh(image_box, "echo planted > /etc/planted && chown root /etc/planted", "root")
    on_host = image_box.layout.image_root / "etc" / "planted"
    assert on_host.stat().st_uid >= UID_BASE
    assert (image_box.layout.image_root / "usr" / "bin").stat().st_uid == on_host.stat().st_uid
    assert image_box.image is not None
    assert not (image_box.image.rootfs / "etc" / "planted").exists()


async def test_a_setuid_root_program_gives_no_root(image_box: LocalSandbox) -> None:
    """The image's root may leave a setuid-root program (as images ship su, or a setup that means harm); run by
    `user` or the grader it gains nothing: the overlay is nosuid and no identity may gain privileges."""
    await _sh(image_box, "cp /usr/bin/id /usr/local/bin/rootid && chmod 4755 /usr/local/bin/rootid", "root")
    assert await _sh(image_box, "stat -c '%a %U' /usr/local/bin/rootid", "root") == "4755 root"
    assert await _sh(image_box, "/usr/local/bin/rootid -u") == "1000"
    assert await _sh(image_box, "/usr/local/bin/rootid -u", "grader") == "1001"


async def test_changes_never_reach_another_rollout_on_the_image(backend: LocalBackend, base_image: str) -> None:
    first = await backend.create(SandboxSpec(image=base_image))
    try:
        await _sh(first, "echo mine > /usr/local/share/first-rollout", "root")
    finally:
        await first.close()
    second = await backend.create(SandboxSpec(image=base_image))
    try:
        assert await _sh(second, "test -e /usr/local/share/first-rollout && echo seen || echo absent") == "absent"
    finally:
        await second.close()


@pytest.fixture
def canaries() -> Iterator[list[Path]]:
    """A file in the server's checkout and one in a host directory of no particular kind, both world-readable."""
    checkout = Path(__file__).resolve().parents[2] / f".canary-{RUN_MARK}"
    elsewhere = Path(f"/opt/opencode-env-canary-{RUN_MARK}") / "secret"
    elsewhere.parent.mkdir(exist_ok=True)
    for canary in (checkout, elsewhere):
        canary.write_text("canary\n")
        canary.chmod(0o644)
    yield [checkout, elsewhere]
    checkout.unlink()
    shutil.rmtree(elsewhere.parent)


async def test_the_host_view_is_an_allow_list(image_box: LocalSandbox, canaries: list[Path]) -> None:
    """What of the host an image's sandbox sees is what our programs need (the loader, libraries, the programs, the
    interpreter's standard library, trust files), read-only; the operator's files are not there at all."""
    for canary in canaries:
        for identity in ("user", "root"):
            for path in (str(canary), f"{HOST_MOUNT}{canary}"):
                seen = await image_box.run(f"cat {path}", timeout_s=60, cwd="/", identity=identity)
                assert seen.exit_code != 0, (identity, path)
                assert "No such file" in seen.stderr
    for target in ("/usr/bin/x", "/new-file"):
        written = await image_box.run(f"touch {HOST_MOUNT}{target}", timeout_s=60, cwd="/", identity="root")
        assert written.exit_code != 0
        assert "Read-only file system" in written.stderr
    assert await _sh(image_box, f"test -e {HOST_MOUNT}{cache_root()}/images || echo hidden", "root") == "hidden"
    assert await _sh(image_box, f"test -e {HOST_MOUNT}/etc/hostname || echo hidden", "root") == "hidden"


async def test_a_sandbox_on_the_host_s_own_system_sees_only_its_system_directories(
    backend: LocalBackend, canaries: list[Path]
) -> None:
    """Image "host": the host's programs, libraries and /etc, read-only; the checkout (but for the proxy's Python
    environment when it lives there, read-only), /opt, /var and the operator's homes are not there at all, and a
    build/test workload still runs."""
    sandbox = await backend.create(SandboxSpec(image="host"))
    try:
        for canary in canaries:
            for identity in ("user", "root"):
                seen = await sandbox.run(f"cat {canary}", timeout_s=60, cwd="/", identity=identity)
                assert seen.exit_code != 0, (identity, canary)
                assert "No such file" in seen.stderr
        for hidden in ("/opt", "/srv", "/var/lib", "/var/log"):
            assert await _sh(sandbox, f"test -e {hidden} || echo hidden", "root") == "hidden", hidden
        checkout = Path(__file__).resolve().parents[2]
        # the proxy's Python environment is a provided tool (cached_tools: this interpreter's), shown read-only at its
        # own host path; when it lives in the checkout (a .venv), that is all of the checkout there is
        environment = Path(sys.executable).parent.parent
        listed = f"test -e {checkout} && find {checkout} -mindepth 1 -not -path '{environment}/*' || echo hidden"
        shown = set((await _sh(sandbox, listed, "root")).splitlines())
        if environment.is_relative_to(checkout):
            assert shown == {str(p) for p in [environment, *environment.parents] if checkout in p.parents}
            planted = await sandbox.run(f"touch {environment}/x", timeout_s=60, cwd="/", identity="root")
            assert "Read-only file system" in planted.stderr
        else:
            assert shown == {"hidden"}
        written = await sandbox.run("touch /usr/bin/x /etc/x", timeout_s=60, cwd="/", identity="root")
        assert "Read-only file system" in written.stderr
        work = "cd /home/user/workdir && git init -q && printf 'def test_a():\\n    assert 1\\n' > test_a.py"
        assert await _sh(sandbox, f"{work} && python3 -c 'import json, ssl, sqlite3; print(1)'") == "1"
    finally:
        await sandbox.close()


async def test_readme_example_runs_on_the_default_image(
    opencode_binary: Path, sandbox_base: Path, base_image: str
) -> None:
    """A request naming no image runs on the base image: `pip install pytest` (as the sandbox's root) and
    `python -m pytest` (as the grader) work as the README writes them."""
    backend = LocalBackend(cached_tools, base_dir=sandbox_base)
    test_file = "from add import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    outcome = await rollout(
        backend,
        demo_script(),
        setup=["pip install pytest"],
        verify_files={"test_add.py": test_file},
        verify=["cd /home/user/workdir && python -m pytest -q"],
    )
    result = outcome.result
    assert result.status == "completed", result.error
    assert result.enforcement["image"].startswith(base_image)
    assert result.reward == 1.0, [(v.stdout[-300:], v.stderr[-300:]) for v in result.verify_results]


async def test_setup_as_root_installs_what_verify_uses(backend: LocalBackend, base_image: str) -> None:
    site = "/usr/local/lib/python3.11/dist-packages"
    outcome = await rollout(
        backend,
        demo_script(),
        image=base_image,
        setup=[f"mkdir -p {site} && echo 'ANSWER = 42' > {site}/planted_by_setup.py", "id -u > setup-uid"],
        verify=[
            "python -c 'import planted_by_setup as p; assert p.ANSWER == 42'",
            'test "$(cat /home/user/workdir/setup-uid)" = 0 && test -O /home/user/workdir/add.py || true',
            "python -c 'from add import add; print(float(add(0.5, 0.5)))' > /logs/verifier/reward.txt",
        ],
    )
    result = outcome.result
    assert result.status == "completed", result.error
    assert [v.exit_code for v in result.verify_results] == [0, 0, 0], result.verify_results
    assert result.reward == 1.0
    assert result.reward_source == "reward_txt"


async def test_agent_runs_in_an_image_without_libc(backend: LocalBackend, busybox_image: str) -> None:
    """OpenCode, its tools' shell and our helpers start from the host with the host's loader; the task's commands
    run the image's own busybox."""
    outcome = await rollout(
        backend,
        demo_script(),
        image=busybox_image,
        verify=["test -f add.py && grep -q 'def add' add.py && echo 1 > /logs/verifier/reward.txt"],
    )
    result = outcome.result
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert result.enforcement["image"].startswith(busybox_image)
    assert {(call.tool, call.status) for call in result.tool_calls} == {("write", "completed"), ("bash", "completed")}


async def test_image_from_an_oci_archive(sandbox_base: Path, busybox_image: str, tmp_path: Path) -> None:
    """From the operator's archive directory only; a caller's other path gets one answer, whether a file is there
    or not, and nothing is loaded."""
    archive = tmp_path / "busybox.oci.tar"
    saved = await asyncio.create_subprocess_exec(
        "podman", "save", "--quiet", "--format", "oci-archive", "-o", str(archive), busybox_image
    )
    assert await saved.wait() == 0
    refusing = LocalBackend(cached_tools, base_dir=sandbox_base)
    backend = LocalBackend(cached_tools, base_dir=sandbox_base, image_archive_dir=tmp_path)
    answers = set()
    for named, by in [(archive, refusing), ("/etc/passwd", backend), ("/no/such.tar", backend), ("x.tar", backend)]:
        with pytest.raises(SandboxError) as refused:
            await by.create(SandboxSpec(image=f"oci-archive:{named}"))
        answers.add(str(refused.value))
    assert len(answers) == 1, answers
    assert "/etc/passwd" not in answers.pop()
    sandbox = await backend.create(SandboxSpec(image=f"oci-archive:{archive}"))
    try:
        assert await _sh(sandbox, "busybox echo from-the-archive") == "from-the-archive"
        assert sandbox.image is not None
        assert sandbox.image.image_id
    finally:
        await sandbox.close()


async def test_an_image_not_on_this_machine_is_never_pulled(backend: LocalBackend) -> None:
    with ScriptedModelServer(demo_script()) as model:
        request = demo_request(model.base_url, image="docker.io/library/never-pulled:1")
        result = await run_rollout(request, backend)
    assert result.status == "sandbox_error"
    assert "never pulled" in (result.error or "")
    assert "never-pulled" in (result.error or "")


@pytest.mark.timeout(600)  # an image imported, unpacked, mounted by a rollout and pruned: 119 s at load 12
@pytest.mark.parametrize("mount_table", ["read", "blind"])
async def test_prune_removes_what_storage_dropped_but_never_what_is_mounted(
    backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mount_table: str
) -> None:
    """`blind`: the mount table names no tree, as when the cache is on a file system of its own (mountinfo gives a
    mount's path within its file system): a live sandbox's tree stays all the same, held for the sandbox's life."""
    if mount_table == "blind":
        monkeypatch.setattr(budget, "mounted_sources", set)
    store = ImageStore(cache_root() / "images")
    archive = tmp_path / "tiny.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add("/bin/busybox", "bin/busybox")
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)
    tags = [f"localhost/opencode-env-test/prune-{name}:{os.getpid()}" for name in ("gone", "mounted")]
    for index, tag in enumerate(tags):
        changed = ["--change", f"ENV MARK={index}-{mount_table}-{RUN_MARK}"]
        made = await asyncio.create_subprocess_exec("podman", "import", "--quiet", *changed, str(archive), tag)
        assert await made.wait() == 0
    gone, mounted = (store.prepare(tag) for tag in tags)
    sandbox = await backend.create(SandboxSpec(image=tags[1]))
    try:
        for tag in tags:
            removed = await asyncio.create_subprocess_exec(
                "podman", "rmi", "--force", tag, stdout=asyncio.subprocess.DEVNULL
            )
            assert await removed.wait() == 0
        store.prune()
        assert not gone.rootfs.exists(), "a tree whose image storage dropped is removed (by this prune or another's)"
        assert mounted.rootfs.exists(), "a tree a rollout has mounted stays"
        assert await _sh(sandbox, "busybox echo still-here") == "still-here"
    finally:
        await sandbox.close()
    store.prune()
    assert not mounted.rootfs.exists(), "once its rollout is gone, the tree goes too"


def test_busybox_image_has_no_libc(busybox_image: str) -> None:
    """The premise of the libc-free test: nothing in the image but busybox and its links."""
    mounted = subprocess.run(["podman", "image", "mount", busybox_image], capture_output=True, text=True, check=True)
    try:
        root = Path(mounted.stdout.strip())
        files = sorted(str(path.relative_to(root)) for path in root.rglob("*") if not path.is_dir())
        links = [str(path.relative_to(root)) for path in root.rglob("*") if path.is_symlink()]
        assert sorted(set(files) - set(links)) == ["bin/busybox"]
    finally:
        subprocess.run(["podman", "image", "unmount", busybox_image], check=False, capture_output=True)
    assert shutil.which("podman") is not None


def test_prunes_at_once_each_remove_a_tree_once_and_never_fail(tmp_path: Path) -> None:
    """Every server and test worker of a machine shares one image cache, and each may prune it: prunes at once never
    fail on a tree another removed, and each tree is removed by exactly one of them."""
    trees = [f"{index:064x}" for index in range(8)]
    for tree in trees:
        (tmp_path / tree / "rootfs").mkdir(parents=True)
        (tmp_path / tree / ".complete").touch()
    with ThreadPoolExecutor(4) as pool:
        removed = [tree for pruned in pool.map(lambda _: ImageStore(tmp_path).prune(), range(4)) for tree in pruned]
    assert sorted(removed) == trees
    assert list(tmp_path.iterdir()) == []


def test_a_tree_a_killed_pruner_took_goes_with_the_next_prune(tmp_path: Path) -> None:
    """A pruner killed between taking a tree and removing it (its process ends at the removal) leaves the tree
    renamed; the next prune removes it, and never a tree a live pruner has taken."""
    dropped = f"{1:064x}"
    (tmp_path / dropped / "rootfs" / "bin").mkdir(parents=True)
    (tmp_path / dropped / ".complete").touch()
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, shutil, sys\n"
            "shutil.rmtree = lambda *args, **kwargs: os._exit(9)\n"
            "from opencode_env.sandbox.local.images.store import ImageStore\n"
            "from pathlib import Path\n"
            "ImageStore(Path(sys.argv[1])).prune()\n",
            str(tmp_path),
        ],
        capture_output=True,
        check=False,
    )
    assert killed.returncode == 9, killed.stderr
    [left] = list(tmp_path.iterdir())
    assert left.name.startswith(f".pruned-{dropped}-")
    live = tmp_path / f".pruned-{2:064x}-{os.getpid()}-1"
    (live / "rootfs").mkdir(parents=True)

    assert ImageStore(tmp_path).prune() == []
    assert list(tmp_path.iterdir()) == [live]


def test_a_killed_unpackers_tree_goes_with_the_next_unpack(busybox_image: str, tmp_path: Path) -> None:
    """An unpacker killed mid-copy leaves its staging tree in the image's directory; the next unpack of that image
    (under the same lock) removes it before copying again."""
    store = ImageStore(tmp_path)
    first = store.prepare(busybox_image)
    directory = first.rootfs.parent
    (directory / ".complete").unlink()
    shutil.rmtree(first.rootfs)
    staging = directory / ".rootfs-killed"
    (staging / "bin").mkdir(parents=True)
    (staging / "bin" / "half-copied").write_bytes(b"\0" * 1024)

    again = store.prepare(busybox_image)

    assert [path.name for path in directory.glob(".rootfs-*")] == []
    assert (again.rootfs / "bin" / "busybox").is_file()


def _fds_open_on(path: Path) -> list[str]:
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if os.readlink(fd) == str(path):
                found.append(fd.name)
        except FileNotFoundError:
            continue
    return found


async def test_a_create_cancelled_while_its_image_mounts_leaves_no_tree_mount_or_hold(
    busybox_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setup deadline cancels a sandbox's creation while its thread is mounting the image: the creation ends
    cancelled only after that thread, with the tree, its mount, its uid lease and the image's hold all let go (the
    cleanup used to run beside the thread still mounting, and the lease was left to the garbage collector)."""
    mounting, real_mount = threading.Event(), layout.mount_image

    def slow_mount(*args: Any, **kwargs: Any) -> Path:
        mounting.set()
        time.sleep(1.0)
        return real_mount(*args, **kwargs)

    monkeypatch.setattr(layout, "mount_image", slow_mount)
    base = tmp_path / "sandboxes"
    base.mkdir()
    backend = LocalBackend(cached_tools, base_dir=base)
    creating = asyncio.ensure_future(backend.create(SandboxSpec(image=busybox_image)))
    assert await asyncio.to_thread(mounting.wait, 300)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    assert list(base.iterdir()) == []
    assert str(base) not in Path("/proc/self/mountinfo").read_text()
    image_lock = ImageStore(cache_root() / "images").prepare(busybox_image).rootfs.parent / ".lock"
    assert _fds_open_on(image_lock) == []
