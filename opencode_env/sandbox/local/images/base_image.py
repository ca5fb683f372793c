"""The base image: what a request that names no image runs on the local backend once it is built: Debian with
Python, pip, venv, pytest, git and curl, made from Debian's packages with debootstrap (no image registry needed) and
imported into podman's storage. Unlike Debian's own Python it lets pip install into the system (as the Python images
of Docker Hub do): a task's setup runs as the sandbox's root, and what it installs there verify finds too."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from opencode_env.sandbox.local.images.store import BASE_IMAGE, image_exists
from opencode_env.sandbox.local.tools import cache_root

log = logging.getLogger("opencode_env.base_image")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "python3",
    "python3-pip",
    "python3-venv",
    "python3-pytest",
    "python-is-python3",
    "git",
    "ca-certificates",
    "curl",
    "procps",
)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUILD_TIMEOUT_S = 1800.0


class BaseImageError(Exception):
    """The base image could not be built."""


def build_base_image(
    *,
    suite: str = SUITE,
    mirror: str = MIRROR,
    tag: str = BASE_IMAGE,
    force: bool = False,
    say: Callable[[str], None] = log.info,
    cache: Path | None = None,
) -> str:
    """Build (or find) the base image; the Debian tree is cached as a tar under `cache` (default `cache_root()`), so
    a rebuild imports it again in seconds."""
    if not force and image_exists(tag):
        say(f"{tag} is in podman's storage already")
        return tag
    for program in ("debootstrap", "podman"):
        if shutil.which(program) is None:
            raise BaseImageError(f"{program} is not installed (apt-get install debootstrap podman)")
    if os.geteuid() != 0:
        raise BaseImageError("building the base image needs root (debootstrap makes a root file system)")
    archive = _debian_tree(suite, mirror, cache or cache_root(), force=force, say=say)
    changes = ["--change", f"ENV PATH={PATH}", "--change", "ENV LANG=C.UTF-8", "--change", "WORKDIR /"]
    _run(["podman", "import", "--quiet", *changes, str(archive), tag], "podman import")
    say(f"imported {tag} from {archive}")
    return tag


def _debian_tree(suite: str, mirror: str, cache: Path, *, force: bool, say: Callable[[str], None]) -> Path:
    recipe = hashlib.sha256(f"{suite} {mirror} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    archive = cache / f"base-{suite}-{recipe}.tar"
    if archive.is_file() and not force:
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="opencode-env-base-"))
    try:
        say(f"debootstrap {suite} with {', '.join(PACKAGES)} (a minute or two)")
        _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(root), mirror],
            "debootstrap",
        )
        for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        for leftovers in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / leftovers).glob("*"):
                if entry.is_file():
                    entry.unlink()
        staging = archive.with_name(f".{archive.name}.{os.getpid()}")
        try:
            _run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(staging), "."], "packing the tree")
        except BaseImageError:
            staging.unlink(missing_ok=True)
            raise
        staging.rename(archive)
        return archive
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise BaseImageError(f"{what} failed: {(done.stderr or done.stdout).strip()[-800:]}")
