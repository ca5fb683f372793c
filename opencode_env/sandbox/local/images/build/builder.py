"""Task images built from a build context, offline (never pulled), in a box (box.py), and cached by content.

A context's image is tagged `localhost/opencode-env-task/<name>:<sha256 of the context>`, so a context built once is
found again by its tag and never rebuilt; a changed file gives a new tag. The context is copied (files/data_dir.py: no
link followed, none allowed) into the box's work directory and built there; the image is then loaded into this
machine's container storage, where the local backend takes its images from.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opencode_env.sandbox.base import SandboxError
from opencode_env.sandbox.local.files.data_dir import DataDir
from opencode_env.sandbox.local.images.budget import TASK_REPOSITORY, ImageBudget
from opencode_env.sandbox.local.images.build.box import (
    BOX_DISK_BYTES,
    CAP_DROP,
    DEFAULT_ROOT,
    MAX_BUILD_TIMEOUT_S,
    MAX_CONTEXT_BYTES,
    Bind,
    BoxError,
    BuildBox,
    OnLine,
    run_group,
    tail,
)
from opencode_env.sandbox.local.images.build.dockerfile import DockerfileError, base_images
from opencode_env.sandbox.local.images.build.hints import offline_hint
from opencode_env.sandbox.local.tools import cache_root
from opencode_env.settings import DEFAULT_IMAGE_STORAGE_MB, Settings

TAG_REPOSITORY = TASK_REPOSITORY
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n'
QUERY_TIMEOUT_S = 60.0
COPY_TIMEOUT_S = 600.0
_HASH_FORMAT = b"opencode-env task image context v2 (built in the box)\n"
IMAGE_REFERENCE = re.compile(
    r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
"""An image reference as OCI distribution spells it (registry host, path, tag, digest); nothing that starts with '-'."""


BUILD = "/box/build"
"""Inside the box: this build's directory (its context, and the archive the built image is saved to)."""
STORE = "/box/store"
"""Inside the box: the container storage a podman call writes."""


@dataclass(frozen=True)
class BoxView:
    """What one build's podman calls see of the box: its own directory (context, storage, archive) and, read-only,
    the stores of the base images its Dockerfile names."""

    box: BuildBox
    build: Path
    bases: list[str]

    def run(self, args: list[str], timeout_s: float, *, what: str = "", on_line: OnLine | None = None) -> None:
        read_only = tuple(
            Bind(self.box.base_store(image), f"/box/bases/{self.box.base_store(image).name}") for image in self.bases
        )
        self.box.run(
            args,
            timeout_s,
            what=what or f"podman {args[0]} in the build box",
            store=Bind(self.build, BUILD, writable=True),
            image_stores=read_only,
            on_line=on_line,
        )


def is_image_reference(text: str) -> bool:
    return len(text) <= 512 and IMAGE_REFERENCE.match(text) is not None


BuildProgress = Callable[[str], None]
"""Where a build says what it is doing, one line at a time: the build's own `STEP n/m: ...` and `COMMIT` lines as
podman prints them, and each image archive saved, copied or loaded (its size, then its time). The CLI prints them on
stderr."""
_STEP = re.compile(r"^(?:STEP \d+/\d+: |COMMIT )")
MAX_PROGRESS_CHARS = 200


def _quiet(_: str) -> None:
    pass


def megabytes(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


class ImageBuildError(RuntimeError):
    """podman is missing, or a podman call failed or timed out (the message carries the tail of its stderr)."""


class BuildContext(DataDir):
    """The directory holding a build context, read as data; a link or a special file in it fails the build."""

    error = ImageBuildError


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    image_id: str
    workdir: str
    """The image's WORKDIR as podman reports it ('' when the image sets none)."""
    cached: bool = False
    """True when an image with this content's tag was already in container storage (nothing was built)."""


def context_hash(context_dir: Path) -> str:
    """sha256 over the context's entries in sorted order: relative path, kind, mode, and the contents of a file;
    read as data (a link or a special file fails the build, at most MAX_CONTEXT_BYTES of contents)."""
    context = BuildContext(context_dir.parent)
    digest = hashlib.sha256(_HASH_FORMAT)
    total = 0
    for entry, kind in sorted(context.walk(context_dir.name)):
        relative = entry.removeprefix(context_dir.name + "/").encode()
        mode = context.mode(entry)
        digest.update(len(relative).to_bytes(8, "big") + relative)
        digest.update(f"{stat.S_IFMT(mode):o} {stat.S_IMODE(mode):o}\n".encode())
        body = context.read_bytes(entry, MAX_CONTEXT_BYTES - total) if kind == "file" else b""
        total += len(body)
        digest.update(len(body).to_bytes(8, "big") + body)
    return digest.hexdigest()


def repository_name(name: str) -> str:
    """`name` as one lowercase component of an image repository (letters, digits and single separators)."""
    component = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return component[:128] or "task"


def containers_conf(cache: Path | None = None) -> Path:
    """A containers.conf for podman in a container like this one: crun fails here, and podman's default ulimits
    exceed what runc may set, so: runc, and no default ulimits. Kept in `cache` (default: the operator's
    OPENCODE_ENV_CACHE, else ~/.cache/opencode-env)."""
    path = (cache or cache_root()) / "containers.conf"
    if path.is_file() and path.read_text() == CONTAINERS_CONF:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".containers.conf.{os.getpid()}")
    staging.write_text(CONTAINERS_CONF)
    staging.replace(path)
    return path


class ImageBuilder:
    """Builds and inspects images in this machine's container storage with podman; never pulls."""

    def __init__(
        self,
        podman: str | None = None,
        box_root: Path | None = None,
        progress: BuildProgress | None = None,
        box_disk_bytes: int = BOX_DISK_BYTES,
        budget: ImageBudget | None = None,
    ) -> None:
        """`budget`: the image storage budget a built image is charged to (default: the default budget over the
        default cache's ledger; `for_settings` gives the operator's, the one the local backend uses)."""
        found = podman or shutil.which("podman")
        if found is None:
            raise ImageBuildError("podman is not installed: apt-get install podman buildah")
        self.podman = found
        self.box_root = box_root or DEFAULT_ROOT
        self.progress = progress or _quiet
        self.box_disk_bytes = box_disk_bytes
        self.budget = budget or ImageBudget(cache_root() / "images", DEFAULT_IMAGE_STORAGE_MB << 20)

    @classmethod
    def for_settings(cls, settings: Settings, *, progress: BuildProgress | None = None) -> ImageBuilder:
        """A builder charging the operator's image storage budget (OPENCODE_ENV_IMAGE_STORAGE_MB) in the ledger of
        their cache (OPENCODE_ENV_CACHE): the budget the local backend charges its unpacked images to."""
        budget = ImageBudget(cache_root(settings.cache) / "images", settings.image_storage_mb << 20)
        return cls(progress=progress, budget=budget)

    def _step(self, line: str) -> None:
        """One line of podman build's output: its STEP and COMMIT lines are passed on (a RUN step's output is not)."""
        if _STEP.match(line):
            self.progress(line[:MAX_PROGRESS_CHARS])

    def build(self, context_dir: Path, *, name: str, timeout_s: float) -> BuiltImage:
        """The image of `context_dir` (its Dockerfile), built in the box unless its content's tag is already
        present; `timeout_s` is capped at MAX_BUILD_TIMEOUT_S."""
        context = BuildContext(context_dir.parent)
        if context.kind(f"{context_dir.name}/Dockerfile") != "file":
            raise ImageBuildError(f"{context_dir / 'Dockerfile'}: no Dockerfile in the build context")
        ref = f"{TAG_REPOSITORY}/{repository_name(name)}:{context_hash(context_dir)}"
        cached = self.image_exists(ref)
        if cached:
            self.progress(f"{ref} is built already (same context): nothing to build")
            self._use(ref)
        else:
            self.progress(f"building {ref} from {context_dir}")
            started = time.monotonic()
            try:
                self._build_in_box(context, context_dir.name, ref, min(timeout_s, MAX_BUILD_TIMEOUT_S))
            except BoxError as error:
                raise ImageBuildError(offline_hint(str(error))) from None
            self.progress(f"built {ref} in {time.monotonic() - started:.1f}s")
        return BuiltImage(ref=ref, image_id=self.image_id(ref), workdir=self.image_workdir(ref), cached=cached)

    def _build_in_box(self, context: BuildContext, relative: str, ref: str, timeout_s: float) -> None:
        box = BuildBox(self.box_root, self.podman, self.box_disk_bytes)
        box.prepare()
        build = box.new_build_dir(ref.rsplit(":", 1)[1][:16])
        try:
            context.copy_tree(relative, build / "context", limit_bytes=MAX_CONTEXT_BYTES)
            box.hand_over(build)
            dockerfile = (build / "context" / "Dockerfile").read_text(errors="replace")
            try:
                named = base_images(dockerfile)
            except DockerfileError as error:
                raise ImageBuildError(f"{context.path / relative}: {error}") from None
            bases = [image for image in named if self._base_into_box(box, image)]
            view = BoxView(box, build, bases)
            args = ["build", "--pull=never", "--isolation", "chroot", "--network", "host", "--cap-drop", CAP_DROP]
            args += ["-t", ref, "-f", f"{BUILD}/context/Dockerfile", "--", f"{BUILD}/context"]
            view.run(args, timeout_s, what=f"building {context.path / relative}", on_line=self._step)
            self.progress("saving the built image out of the build box")
            view.run(["save", "--format", "docker-archive", "-o", f"{BUILD}/image.tar", "--", ref], COPY_TIMEOUT_S)
            self._charge(build / "image.tar", ref)
            try:
                self._load_from_box(build / "image.tar", ref)
            except BaseException:
                self.budget.release(ref)
                raise
        finally:
            shutil.rmtree(build, ignore_errors=True)

    def _charge(self, archive: Path, ref: str) -> None:
        """The built image's archive charged to the image storage budget before it is loaded (what it does not fit
        never reaches this machine's storage)."""
        try:
            self.budget.charge("image", ref, archive.lstat().st_size, what=f"the built image {ref}")
        except SandboxError as error:  # over the budget, or its ledger held past its deadline
            raise ImageBuildError(str(error)) from None

    def _use(self, ref: str) -> None:
        size = self._inspect(ref, "{{.Size}}")
        try:
            self.budget.use("image", ref, int(size) if size.isdigit() else 0, what=f"the image {ref}")
        except SandboxError as error:  # over the budget, or its ledger held past its deadline
            raise ImageBuildError(str(error)) from None

    def _base_into_box(self, box: BuildBox, image: str) -> bool:
        """The base image `image` from this machine's storage into its own store in the box (once: the box keeps
        it); False when this machine does not have it (the build then fails with podman's own message for it:
        images are never pulled)."""
        if box.has_base(image):
            return True
        if not self.image_exists(image):
            return False
        store = box.base_store(image)
        with store.with_suffix(".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if box.has_base(image):
                return True
            shutil.rmtree(store, ignore_errors=True)  # a load that did not finish
            store.mkdir(mode=0o700)
            staging = box.new_build_dir("base")
            self.progress(f"copying the base image {image} into the build box")
            started = time.monotonic()
            try:
                self._run(
                    ["save", "--format", "docker-archive", "-o", str(staging / "base.tar"), "--", image],
                    COPY_TIMEOUT_S,
                    what="",
                )
                box.hand_over(store)
                box.hand_over(staging)
                size = megabytes((staging / "base.tar").stat().st_size)
                self.progress(f"loading {image} in the build box ({size} archive)")
                box.run(
                    ["load", "-i", f"{BUILD}/base.tar"],
                    COPY_TIMEOUT_S,
                    what=f"copying {image} into the build box",
                    store=Bind(store, STORE, writable=True),
                    inputs=(Bind(staging, BUILD),),
                )
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            store.with_suffix(".complete").touch()
            self.progress(f"loaded {image} in the build box in {time.monotonic() - started:.1f}s")
        return True

    def _load_from_box(self, archive: Path, ref: str) -> None:
        """The box's archive of `ref` into this machine's storage, opened here without following a link."""
        fd = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ImageBuildError(f"{archive}: the build box's image archive is not a regular file")
            self.progress(f"loading the built image into this machine's storage ({megabytes(info.st_size)} archive)")
            started = time.monotonic()
            # -i /proc/self/fd/0: podman reads our descriptor in place (from a pipe-like stdin it copies it first)
            argv = [self.podman, "load", "-i", "/proc/self/fd/0"]
            completed = run_group(argv, COPY_TIMEOUT_S, env=None, what="", stdin=fd)
        finally:
            os.close(fd)
        if completed.returncode != 0 or not self.image_exists(ref):
            raise ImageBuildError(f"loading {ref} from the build box failed: {tail(completed.stderr)}")
        self.progress(f"loaded the built image in {time.monotonic() - started:.1f}s")

    def image_exists(self, ref: str) -> bool:
        completed = self._run(["image", "exists", "--", ref], QUERY_TIMEOUT_S, what=f"looking up {ref}", ok=(0, 1))
        return completed.returncode == 0

    def image_workdir(self, ref: str) -> str:
        return self._inspect(ref, "{{.Config.WorkingDir}}")

    def image_user(self, ref: str) -> str:
        """The image's USER ('' when it sets none)."""
        return self._inspect(ref, "{{.Config.User}}")

    def image_entrypoint(self, ref: str) -> list[str]:
        """The image's ENTRYPOINT as words ([] when it sets none; a shell form reads ["/bin/sh", "-c", ...])."""
        return self._words(ref, "Entrypoint", "ENTRYPOINT")

    def image_command(self, ref: str) -> list[str]:
        """The image's CMD as words ([] when it sets none)."""
        return self._words(ref, "Cmd", "CMD")

    def _words(self, ref: str, field: str, instruction: str) -> list[str]:
        try:
            words = json.loads(self._inspect(ref, f"{{{{json .Config.{field}}}}}") or "null")
        except json.JSONDecodeError as error:
            raise ImageBuildError(f"{ref}: podman reported an {instruction} that is not JSON: {error}") from None
        if words is None:
            return []
        if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
            raise ImageBuildError(f"{ref}: its {instruction} is not a list of words: {str(words)[:200]}")
        return words

    def image_id(self, ref: str) -> str:
        return self._inspect(ref, "{{.Id}}")

    def _inspect(self, ref: str, template: str) -> str:
        argv = ["image", "inspect", "--format", template, "--", ref]
        return self._run(argv, QUERY_TIMEOUT_S, what=f"inspecting {ref}").stdout.strip()

    def _run(
        self, argv: list[str], timeout_s: float, *, what: str, ok: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        try:
            completed = run_group([self.podman, *argv], timeout_s, env=None, what=what)
        except BoxError as error:
            raise ImageBuildError(str(error)) from None
        if completed.returncode not in ok:
            raise ImageBuildError(f"{what}: podman {argv[0]} exited {completed.returncode}: {tail(completed.stderr)}")
        return completed
