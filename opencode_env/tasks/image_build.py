"""Task images built with podman from a build context, offline (never pulled) and cached by content.

A context's image is tagged `localhost/opencode-env-task/<name>:<sha256 of the context>`, so a context built once is
found again by its tag and never rebuilt; a changed file gives a new tag.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opencode_env.sandbox.local.tools import cache_root
from opencode_env.settings import Settings

TAG_REPOSITORY = "localhost/opencode-env-task"
TERMINATE_GRACE_S = 10.0
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n'
QUERY_TIMEOUT_S = 60.0
STDERR_TAIL_CHARS = 4000
_HASH_FORMAT = b"opencode-env task image context v1\n"


class ImageBuildError(RuntimeError):
    """podman is missing, or a podman call failed or timed out (the message carries the tail of its stderr)."""


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    image_id: str
    workdir: str
    """The image's WORKDIR as podman reports it ('' when the image sets none)."""
    cached: bool = False
    """True when an image with this content's tag was already in container storage (nothing was built)."""


def context_hash(context_dir: Path) -> str:
    """sha256 over the context's entries in sorted order: relative path, kind, mode, and the contents of a file or
    the target of a symlink (never followed)."""
    digest = hashlib.sha256(_HASH_FORMAT)
    for path in _sorted_entries(context_dir):
        relative = path.relative_to(context_dir).as_posix().encode()
        info = path.lstat()
        digest.update(len(relative).to_bytes(8, "big") + relative)
        digest.update(f"{stat.S_IFMT(info.st_mode):o} {stat.S_IMODE(info.st_mode):o}\n".encode())
        body = _entry_body(path, info)
        digest.update(len(body).to_bytes(8, "big") + body)
    return digest.hexdigest()


def _sorted_entries(root: Path) -> list[Path]:
    entries: list[Path] = []
    pending = [root]
    while pending:
        directory = pending.pop()
        for child in directory.iterdir():
            entries.append(child)
            if child.is_dir() and not child.is_symlink():
                pending.append(child)
    return sorted(entries, key=lambda path: path.relative_to(root).as_posix())


def _entry_body(path: Path, info: os.stat_result) -> bytes:
    if stat.S_ISLNK(info.st_mode):
        return os.readlink(path).encode()
    if stat.S_ISREG(info.st_mode):
        return path.read_bytes()
    return b""


def repository_name(name: str) -> str:
    """`name` as one lowercase component of an image repository (letters, digits and single separators)."""
    component = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return component[:128] or "task"


def containers_conf(cache: Path | None = None) -> Path:
    """A containers.conf for podman in a container like this one: crun fails here, and podman's default ulimits
    exceed what runc may set, so: runc, and no default ulimits. Kept in `cache` (default: the operator's
    OPENCODE_ENV_CACHE, else ~/.cache/opencode-env)."""
    path = (cache or cache_root(Settings.load().cache)) / "containers.conf"
    if path.is_file() and path.read_text() == CONTAINERS_CONF:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".containers.conf.{os.getpid()}")
    staging.write_text(CONTAINERS_CONF)
    staging.replace(path)
    return path


def _podman_env() -> dict[str, str]:
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        env["CONTAINERS_CONF"] = str(containers_conf())
    return env


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= STDERR_TAIL_CHARS else "..." + text[-STDERR_TAIL_CHARS:]


class ImageBuilder:
    """Builds and inspects images in this machine's container storage with podman; never pulls."""

    def __init__(self, podman: str | None = None) -> None:
        found = podman or shutil.which("podman")
        if found is None:
            raise ImageBuildError("podman is not installed: apt-get install podman buildah")
        self.podman = found

    def build(self, context_dir: Path, *, name: str, timeout_s: float) -> BuiltImage:
        """The image of `context_dir` (its Dockerfile), built unless its content's tag is already present."""
        dockerfile = context_dir / "Dockerfile"
        if not dockerfile.is_file():
            raise ImageBuildError(f"{dockerfile}: no Dockerfile in the build context")
        ref = f"{TAG_REPOSITORY}/{repository_name(name)}:{context_hash(context_dir)}"
        cached = self.image_exists(ref)
        if not cached:
            argv = ["build", "--pull=never", "--network", "host", "-t", ref, "-f", str(dockerfile), str(context_dir)]
            self._run(argv, timeout_s, what=f"building {context_dir}")
        return BuiltImage(ref=ref, image_id=self.image_id(ref), workdir=self.image_workdir(ref), cached=cached)

    def image_exists(self, ref: str) -> bool:
        completed = self._run(["image", "exists", ref], QUERY_TIMEOUT_S, what=f"looking up {ref}", ok=(0, 1))
        return completed.returncode == 0

    def image_workdir(self, ref: str) -> str:
        return self._inspect(ref, "{{.Config.WorkingDir}}")

    def image_id(self, ref: str) -> str:
        return self._inspect(ref, "{{.Id}}")

    def _inspect(self, ref: str, template: str) -> str:
        argv = ["image", "inspect", "--format", template, ref]
        return self._run(argv, QUERY_TIMEOUT_S, what=f"inspecting {ref}").stdout.strip()

    def _run(
        self, argv: list[str], timeout_s: float, *, what: str, ok: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        completed = _run_group([self.podman, *argv], timeout_s, env=_podman_env(), what=what)
        if completed.returncode not in ok:
            raise ImageBuildError(f"{what}: podman {argv[0]} exited {completed.returncode}: {_tail(completed.stderr)}")
        return completed


def _run_group(
    argv: list[str], timeout_s: float, *, env: dict[str, str], what: str
) -> subprocess.CompletedProcess[str]:
    """Run argv in its own process group, which is stopped whole on timeout (podman build leaves children): SIGTERM
    first so podman can remove its build container, then SIGKILL."""
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stderr = _stop_group(process)
            raise ImageBuildError(f"{what}: podman timed out after {timeout_s:g} s: {_tail(stderr)}") from None
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _stop_group(process: subprocess.Popen[str]) -> str:
    """podman's stderr after SIGTERM, then SIGKILL, to its process group."""
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):  # the group is already gone: what we wanted
            os.killpg(process.pid, signal_number)
        try:
            return process.communicate(timeout=TERMINATE_GRACE_S)[1]
        except subprocess.TimeoutExpired:
            continue
    return "(no output: a process outside podman's group holds its pipes)"
