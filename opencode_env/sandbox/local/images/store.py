"""Images for the local backend: taken from this machine's container storage (podman, buildah) or from an OCI or
docker archive, never pulled. Each image is unpacked once into a cache, a plain tree whose files keep their
in-image owners (rootfs.py gives every rollout a writable overlay over an id-mapped view of it), with the two
accounts every sandbox has (`user`, 1000; `grader`, 1001) added to its /etc/passwd and /etc/group."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.file_lock import wait_lock
from opencode_env.sandbox.local.images.budget import PRUNED_PREFIX, SETTING, ImageBudget, take_tree

log = logging.getLogger("opencode_env.images")
ARCHIVE_PREFIXES = ("oci-archive:", "docker-archive:")
HOST_IMAGE = "host"
"""The image name that means none: the host's own root file system, read-only (the backend's default)."""
BASE_IMAGE = "localhost/opencode-env-base:bookworm"
PODMAN_TIMEOUT_S = 600.0
UNPACK_LOCK_WAIT_S = 3 * PODMAN_TIMEOUT_S
"""The longest a preparer waits for another one unpacking the same image (that one's own calls are bounded)."""
UNPACK_ATTEMPTS = 8
"""How often a preparer starts over on finding the tree it waited for taken (evicted or pruned) meanwhile."""
LOADED = "loaded.json"
"""In the cache: each archive loaded (its path, size and time) and the name loading it gave in podman's storage."""
LOADED_LOCK_WAIT_S = 60.0
ACCOUNT_FILE_BYTES = 1 << 20
REFUSED = ".refused"
"""In an image's cache directory: why its content was refused (kept: an image id names its content)."""
STAGING_PREFIX = ".rootfs-"
"""In an image's cache directory: a tree being unpacked, renamed to `rootfs` when complete."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LOADED = re.compile(r"Loaded image(?:\(s\))?:\s*(\S+)")
ACCOUNTS = (("user", 1000, "/home/user"), ("grader", 1001, "/home/grader/home"))
ImageProgress = Callable[[str], None]
"""Where the store says what takes time (an archive loaded, an image unpacked into the cache), one line at a time;
by default the log."""


class ImageRefused(SandboxError):
    """The image's own content cannot be used (a special file where a regular one must be, a file over its limit):
    the same for every rollout on the image, so it is remembered."""


def _to_log(message: str) -> None:
    log.info("%s", message)


def megabytes(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class PreparedImage:
    """An image unpacked into the cache: its tree and what its configuration says about running it."""

    ref: str
    image_id: str
    rootfs: Path
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    has_shell: bool = True


@dataclass(frozen=True)
class HeldImage:
    """A prepared image whose tree stays in the cache until `release`: its directory's lock is held shared, and an
    evictor or a pruner takes a tree only holding that lock exclusively (images/budget.py take_tree). A local
    sandbox holds it for its life, so that a live rollout's tree never depends on reading the mount table (which
    names a tree by its path within its own file system: the host's path only when the cache is on the root's)."""

    image: PreparedImage
    lock: BinaryIO

    def release(self) -> None:
        self.lock.close()

    def __enter__(self) -> PreparedImage:
        return self.image

    def __exit__(self, *_: object) -> None:
        self.release()


def default_image(configured: str = "") -> str:
    """The image a request that names none runs on: `configured` (the operator's OPENCODE_ENV_LOCAL_IMAGE; 'host':
    the host's root), else the base image when it has been built on this machine (`opencode-env image build-base`),
    else the host's root."""
    if configured:
        return "" if configured == HOST_IMAGE else configured
    return BASE_IMAGE if image_exists(BASE_IMAGE) else ""


def _podman() -> str | None:
    return shutil.which("podman")


def _run_podman(*args: str, timeout_s: float = PODMAN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    podman = _podman()
    if podman is None:
        raise SandboxError("podman is not installed: images come from its container storage (apt-get install podman)")
    return subprocess.run([podman, *args], capture_output=True, text=True, timeout=timeout_s, check=False)


def archive_dir_of(ref: str) -> Path | None:
    """For the operator's own command line: the directory of the archive `ref` names (None for a storage name)."""
    prefix = next((p for p in ARCHIVE_PREFIXES if ref.startswith(p)), None)
    if prefix is None:
        return None
    return Path(os.path.abspath(ref.removeprefix(prefix))).parent.resolve()


def image_exists(ref: str) -> bool:
    """Whether podman's storage holds `ref` (False when podman is not installed)."""
    return _podman() is not None and _run_podman("image", "exists", "--", ref, timeout_s=60).returncode == 0


class ImageStore:
    """The cache of unpacked images, one directory per image id; concurrent preparers wait on a file lock."""

    def __init__(
        self,
        root: Path,
        *,
        archive_dir: Path | None = None,
        progress: ImageProgress | None = None,
        budget: ImageBudget | None = None,
    ) -> None:
        """`archive_dir`: the only directory an `oci-archive:`/`docker-archive:` ref may name a file in (the
        operator's); None refuses archives (a caller naming a host path would have root load it). `progress`: where
        loading an archive and unpacking an image are announced (size first, time once done); default the log.
        `budget`: the image storage budget the cache's trees (and our task images, as rollouts use them) are
        charged to; None charges nothing."""
        self.root = root
        self.budget = budget
        self.archive_dir = archive_dir
        self.progress = progress or _to_log
        self._resolved: dict[str, tuple[int, dict[str, object]]] = {}

    def prepare(self, ref: str) -> PreparedImage:
        """The image unpacked, not held: nothing keeps its tree past the return (for a caller that wants its id, or
        it unpacked; a rollout that mounts the tree holds it until then: `hold`)."""
        with self.hold(ref) as image:
            return image

    def hold(self, ref: str) -> HeldImage:
        """The image unpacked (once per image), its tree held in the cache until released: no eviction or prune
        removes it between this decision to use it and the caller's mount of it."""
        inspected = self._inspect(self._in_storage(ref))
        image_id = str(inspected["Id"])
        config = inspected.get("Config") or {}
        assert isinstance(config, dict)
        size = inspected.get("Size")
        if self.budget is not None:
            self.budget.touch(ref)
        rootfs, lock = self._unpacked(image_id, ref, size)
        try:
            env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
            image = PreparedImage(
                ref=ref,
                image_id=image_id,
                rootfs=rootfs,
                env=env,
                workdir=str(config.get("WorkingDir") or ""),
                has_shell=os.path.lexists(rootfs / "bin" / "sh"),
            )
        except BaseException:
            lock.close()
            raise
        return HeldImage(image, lock)

    def _in_storage(self, ref: str) -> str:
        """The storage name of `ref`: itself, or what loading the archive it names gave (loaded once per file)."""
        prefix = next((p for p in ARCHIVE_PREFIXES if ref.startswith(p)), None)
        if prefix is None:
            return ref
        archive = self._allowed_archive(ref.removeprefix(prefix))
        info = archive.stat()
        key = f"{archive}:{info.st_size}:{info.st_mtime_ns}"
        loaded = self.root / LOADED
        known = _read_loaded(loaded)
        if key in known and image_exists(known[key]):
            return known[key]
        self.progress(f"loading the image archive {archive.name} ({megabytes(info.st_size)})")
        started = time.monotonic()
        completed = _run_podman("load", "-i", str(archive))
        match = _LOADED.search(completed.stdout)
        if completed.returncode != 0 or match is None:
            raise SandboxError(f"image {ref}: podman load failed: {completed.stderr.strip()[-500:]}")
        name = match.group(1).split(",")[0]
        self.progress(f"loaded {archive.name} as {name} in {time.monotonic() - started:.1f}s")
        self.root.mkdir(parents=True, exist_ok=True)
        with wait_lock(self.root / f"{LOADED}.lock", LOADED_LOCK_WAIT_S):  # read, add, write: one writer at a time
            known = _read_loaded(loaded)
            known[key] = name
            _write_atomically(loaded, json.dumps(known))
        return name

    def _allowed_archive(self, named: str) -> Path:
        """The archive file `named`, when it is one in the operator's directory; one answer for every other path,
        existing or not, so a refusal tells nothing about the host's files."""
        refused = SandboxError(
            "image: an archive must be a file in the operator's archive directory "
            "(OPENCODE_ENV_IMAGE_ARCHIVE_DIR; archives are refused when it is unset)"
        )
        if self.archive_dir is None or not named.startswith("/"):
            raise refused
        base = self.archive_dir.resolve()
        archive = Path(os.path.normpath(named))
        if archive.parent != base:
            raise refused
        try:
            opened = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise refused from error
        try:
            if not stat.S_ISREG(os.fstat(opened).st_mode):
                raise refused
        finally:
            os.close(opened)
        return archive

    def _inspect(self, ref: str) -> dict[str, object]:
        """podman's description of an image in storage, kept while the storage's image list is unchanged."""
        stamp = _storage_stamp()
        cached = self._resolved.get(ref)
        if cached is not None and cached[0] == stamp and stamp != 0:
            return cached[1]
        completed = _run_podman("image", "inspect", "--format", "json", "--", ref, timeout_s=60)
        if completed.returncode != 0:
            raise SandboxError(
                f"image {ref} is not in this machine's container storage: build it (podman build) or load it "
                f"(podman load, or name an oci-archive:/docker-archive: file); images are never pulled"
            )
        described = json.loads(completed.stdout)[0]
        self._resolved[ref] = (stamp, described)
        return dict(described)

    def prune(self) -> list[str]:
        """Remove the unpacked trees of images no longer in podman's storage, unless one is in use (a rollout has it
        mounted or holds it to mount, another process is unpacking it: the evictor's rule, take_tree); returns the
        ids removed."""
        if not self.root.is_dir():
            return []
        _remove_dead_pruners_leftovers(self.root)
        removed = []
        for directory in sorted(self.root.iterdir()):
            if not directory.is_dir() or len(directory.name) != 64 or image_exists(directory.name):
                continue
            doomed = take_tree(directory, taken=functools.partial(self._release, directory.name))
            if doomed is None:
                continue  # in use, or another pruner (a process sharing this cache) took it first
            shutil.rmtree(doomed)
            removed.append(directory.name)
        return removed

    def _unpacked(self, image_id: str, ref: str, size: object) -> tuple[Path, BinaryIO]:
        """The image's tree (unpacked first when missing) and its directory's lock, held shared. An evictor or a
        pruner renames the directory away under that lock held exclusively: a preparer that waited on it then holds
        the lock of no tree, and starts over (at most UNPACK_ATTEMPTS times, within UNPACK_LOCK_WAIT_S)."""
        directory = self.root / image_id.removeprefix("sha256:")[:64]
        rootfs = directory / "rootfs"
        charge = size if isinstance(size, int) else 0
        deadline = time.monotonic() + UNPACK_LOCK_WAIT_S
        for _ in range(UNPACK_ATTEMPTS):
            _raise_refused(directory, ref)
            try:
                directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                shared = wait_lock(directory / ".lock", _left(deadline), shared=True)
            except (FileNotFoundError, FileExistsError):
                continue  # taken (renamed away) between making it and locking it, or as mkdir looked at it
            if (directory / ".complete").exists():
                try:
                    if self.budget is not None:
                        self.budget.use("tree", directory.name, charge, what=f"image {ref} unpacked")
                except BaseException:
                    shared.close()
                    raise
                return rootfs, shared
            shared.close()
            try:
                exclusive = wait_lock(directory / ".lock", _left(deadline))
            except FileNotFoundError:
                continue
            with exclusive:
                if not (directory / ".complete").exists():
                    self._unpack(directory, image_id, ref, size, charge)
        raise SandboxError(
            f"image {ref}: its tree in the cache was evicted or pruned {UNPACK_ATTEMPTS} times while this rollout "
            f"waited for it; the image storage budget ({SETTING}) is too small for the images in use at once"
        )

    def _unpack(self, directory: Path, image_id: str, ref: str, size: object, charge: int) -> None:
        """The image copied into `directory`'s `rootfs`, its directory's lock held exclusively."""
        rootfs = directory / "rootfs"
        _raise_refused(directory, ref)
        for leftover in directory.glob(f"{STAGING_PREFIX}*"):
            shutil.rmtree(leftover)  # a killed unpacker's: under this lock no other one is running
        if self.budget is not None:
            self.budget.charge("tree", directory.name, charge, what=f"image {ref} unpacked", keep=(ref,))
        try:
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory))
        except BaseException:
            self._release(directory.name)
            raise
        sized = f" ({megabytes(size)})" if isinstance(size, int) else ""
        self.progress(f"unpacking {ref}{sized} into the image cache (once per image)")
        started = time.monotonic()
        try:
            _copy_image_tree(image_id, staging)
            _add_accounts(staging)
            staging.chmod(0o755)
            if rootfs.exists():
                shutil.rmtree(rootfs)
            staging.rename(rootfs)
        except ImageRefused as refused:
            shutil.rmtree(staging, ignore_errors=True)
            self._release(directory.name)
            _write_atomically(directory / REFUSED, str(refused))
            raise ImageRefused(f"image {ref}: {refused}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            self._release(directory.name)
            raise
        (directory / ".complete").write_text(image_id)
        self.progress(f"unpacked {ref} in {time.monotonic() - started:.1f}s")

    def _release(self, tree: str) -> None:
        if self.budget is not None:
            self.budget.release(tree)


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _read_loaded(path: Path) -> dict[str, str]:
    """The archives loaded.json records, by key, and the names loading them gave; empty when it is missing or is not
    that (a torn or foreign file: its archives are loaded again, and the file rewritten)."""
    try:
        known = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(known, dict):
        return {}
    return {key: name for key, name in known.items() if isinstance(name, str)}


def _remove_dead_pruners_leftovers(root: Path) -> None:
    """Trees taken by a pruner that ended before removing them; a live pruner's are its own to remove."""
    for leftover in root.glob(f"{PRUNED_PREFIX}*"):
        pid = leftover.name.rsplit("-", 2)[-2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            shutil.rmtree(leftover)
        except FileNotFoundError:
            continue  # another prune is sweeping it at once: what either leaves goes with the next prune


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def _raise_refused(directory: Path, ref: str) -> None:
    """The verdict an earlier unpack of this image left, raised again without copying the image again."""
    try:
        why = (directory / REFUSED).read_text()
    except FileNotFoundError:
        return
    raise ImageRefused(f"image {ref}: {why}")


def _storage_stamp() -> int:
    """When podman's list of images last changed (0 when unknown: then nothing is kept)."""
    try:
        return Path("/var/lib/containers/storage/overlay-images/images.json").stat().st_mtime_ns
    except OSError:
        return 0


def _copy_image_tree(image_id: str, target: Path) -> None:
    mounted = _run_podman("image", "mount", "--", image_id)
    if mounted.returncode != 0:
        raise SandboxError(f"podman image mount {image_id[:19]} failed: {mounted.stderr.strip()[-500:]}")
    try:
        copied = subprocess.run(
            ["cp", "-a", "--", f"{mounted.stdout.strip()}/.", str(target)],
            capture_output=True,
            text=True,
            timeout=PODMAN_TIMEOUT_S,
            check=False,
        )
        if copied.returncode != 0:
            raise SandboxError(f"copying image {image_id[:19]} failed: {copied.stderr.strip()[-500:]}")
    finally:
        _run_podman("image", "unmount", "--", image_id)


def _add_accounts(rootfs: Path) -> None:
    """`user` and `grader` in the image's account files, unless it has their uids already (under any name). The
    files are the image's, so they are read as data: from a held descriptor of the tree's /etc, never through a
    link, regular files only (a FIFO or device is refused, never opened to block), at most ACCOUNT_FILE_BYTES; the
    new text replaces them by a rename inside that directory."""
    root = os.open(rootfs, _DIR_FLAGS)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir("etc", 0o755, dir_fd=root)
        try:
            etc = os.open("etc", _DIR_FLAGS, dir_fd=root)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ImageRefused("the image's /etc is not a directory (a link or a file)") from None
            raise
    finally:
        os.close(root)
    try:
        for name, fields in (("passwd", "{name}:x:{uid}:{uid}:{name}:{home}:/bin/sh"), ("group", "{name}:x:{uid}:")):
            text = _read_account_file(etc, name)
            if text is None:
                text = "root:x:0:0:root:/root:/bin/sh\n" if name == "passwd" else "root:x:0:\n"
            taken = {line.split(":")[2] for line in text.splitlines() if line.count(":") >= 2}
            added = [fields.format(name=n, uid=uid, home=home) for n, uid, home in ACCOUNTS if str(uid) not in taken]
            if added:
                ending = "" if text.endswith("\n") or not text else "\n"
                _replace_in(etc, name, text + ending + "\n".join(added) + "\n")
    finally:
        os.close(etc)


def _read_account_file(etc: int, name: str) -> str | None:
    """/etc/`name` of an image (None when it has none), opened without following a link and without blocking."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=etc)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _not_an_account_file(name, os.stat(name, dir_fd=etc, follow_symlinks=False).st_mode) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _not_an_account_file(name, mode)
        data = handle.read(ACCOUNT_FILE_BYTES + 1)
    if len(data) > ACCOUNT_FILE_BYTES:
        raise ImageRefused(f"the image's /etc/{name} is over the limit of {ACCOUNT_FILE_BYTES} bytes")
    return data.decode("utf-8", errors="surrogateescape")


def _not_an_account_file(name: str, mode: int) -> ImageRefused:
    kinds = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}
    kind = kinds.get(stat.S_IFMT(mode), "a directory" if stat.S_ISDIR(mode) else "a device")
    return ImageRefused(
        f"the image's /etc/{name} is {kind}, not a regular file: the host reads an image's files as data (regular "
        "files only, no links followed); make it a plain file in the image"
    )


def _replace_in(directory: int, name: str, text: str) -> None:
    staging = f".{name}.opencode-env-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staging, dir_fd=directory)
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=directory)
    with os.fdopen(fd, "wb") as handle:
        handle.write(text.encode("utf-8", errors="surrogateescape"))
        os.fchmod(handle.fileno(), 0o644)
    os.rename(staging, name, src_dir_fd=directory, dst_dir_fd=directory)


def _write_atomically(path: Path, text: str) -> None:
    """`path` replaced by `text` at once: written to a temporary of this call's own beside it (never a name another
    writer, or thread, uses), flushed to disk, then renamed over it."""
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode())
            os.fchmod(handle.fileno(), 0o644)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        raise
