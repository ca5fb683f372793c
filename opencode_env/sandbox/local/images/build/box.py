"""The box a task image is built in: podman itself runs as the root of a user namespace of unprivileged host uids,
in namespaces of its own, without network, inside a cgroup and on a file system of a fixed size. Podman resolves
links itself (the CVE-2024-1753 class), so in the box a followed link reaches only the box's view, never the host's
files or loopback; images cross its edge as archives, and each build has its own storage, so no build reaches
another. docs/untrusted-tasks.md has the threat and its tests."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from opencode_env.inside import userns
from opencode_env.sandbox.base import ResourceLimits
from opencode_env.sandbox.local.files import bounded_fs
from opencode_env.sandbox.local.isolation import cgroup
from opencode_env.sandbox.local.isolation.bubblewrap import SYSTEM_DIRS
from opencode_env.sandbox.local.isolation.host_ids import UID_BASE

log = logging.getLogger("opencode_env.images")
BUILD_UID = UID_BASE - (1 << 17)
"""The host uid of the box's root; the box maps BUILD_IDS uids from here, none of them any sandbox's (those start at
UID_BASE) or a real account's."""
BUILD_IDS = 1 << 16
MAX_BUILD_TIMEOUT_S = 3600.0
MAX_FILE_BYTES = 8 << 30
"""RLIMIT_FSIZE of everything in the box: no one file (a layer, a RUN step's output) larger than this."""
MAX_CONTEXT_BYTES = 512 << 20
CAP_DROP = "NET_RAW,NET_ADMIN,MKNOD,AUDIT_WRITE,SYS_CHROOT,SYS_PTRACE,SYS_ADMIN,SETFCAP"
"""Dropped from RUN steps on top of podman's defaults: a build installs packages and chowns files, and needs no raw
socket, device node, chroot, tracing or mount."""
TERMINATE_GRACE_S = 10.0
STDERR_TAIL_CHARS = 4000
BOX_DISK_BYTES = 64 << 30
"""The size of the box's own file system (sparse: it takes only what is written): every image, layer, cache and
context of every build together; a build that writes more fails with 'no space left', the host's disk untouched."""
BUILD_LIMITS = ResourceLimits(memory_mb=4096, max_processes=1024, disk_mb=BOX_DISK_BYTES >> 20, cpus=2.0)
"""The box in the sandbox seam's terms: what all of one podman call uses (memory, processes, CPUs: its cgroup), and
the box's own file system (disk). Like a sandbox with network 'none': only its own loopback."""
BOX = "/box"
SCRATCH = f"{BOX}/tmp"
"""Inside the box: the podman call's own HOME, TMPDIR and storage.conf."""
DEFAULT_ROOT = Path("/var/lib/opencode-env/build-box")
"""Every directory leading here must be open to the box's root (an unprivileged uid), which binds it: not under a
0700 home."""
CONTAINERS_CONF = (
    '[containers]\ndefault_ulimits = []\ncgroups = "disabled"\n'
    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "none"\n'
)


OnLine = Callable[[str], None]
"""Called with each line a podman call prints, as it prints it (from a reader thread)."""


class BoxError(RuntimeError):
    """A call in the build box failed or timed out (the message carries the tail of podman's stderr)."""


@dataclass(frozen=True)
class Bind:
    """A host directory a podman call sees at `inside` (read-only unless `writable`)."""

    host: Path
    inside: str
    writable: bool = False


@dataclass(frozen=True)
class BuildBox:
    """One directory on the host holds the box: `conf/` (ours, read-only inside) and `data/`, the mount point of the
    box's own file system (`disk.img`, of `disk_bytes`) holding `bases/` (one image store per base image, read-only
    to builds), `builds/` (one directory per build: its context, storage and archive) and `tmp/` (one HOME and TMPDIR
    per podman call). Without loop devices `data/` is a plain directory, unbounded, and a warning says so."""

    root: Path
    podman: str
    disk_bytes: int = BOX_DISK_BYTES

    @property
    def data(self) -> Path:
        return self.root / "data"

    def prepare(self) -> None:
        self.root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.root.mkdir(mode=0o755, exist_ok=True)
        os.chown(self.root, 0, 0)
        self.root.chmod(0o755)
        with (self.root / "prepare.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._mount_data()
            self._write_conf()
            for name in ("bases", "builds", "tmp"):
                (self.data / name).mkdir(mode=0o755, exist_ok=True)

    def _mount_data(self) -> None:
        """The box's file system on data/: mounted as it is when it exists, made when it does not."""
        for legacy in ("storage", "run", "work", "tmp"):
            shutil.rmtree(self.root / legacy, ignore_errors=True)  # an earlier version's box, shared and unbounded
        self.data.mkdir(mode=0o755, exist_ok=True)
        image = self.root / "disk.img"
        if os.path.ismount(self.data) or not bounded_fs.loop_devices_available():
            if not os.path.ismount(self.data):
                log.warning("no loop devices: the build box's storage (%s) is not size-bounded", self.data)
            return
        if image.exists() and bounded_fs.mount_existing(image, self.data):
            return
        failure = bounded_fs.mount_bounded(image, self.data, self.disk_bytes)
        if failure is not None:
            log.warning("the build box's storage (%s) is not size-bounded: %s", self.data, failure)

    def remove(self) -> None:
        """Unmount the box's file system and remove the whole box (its images and caches with it)."""
        if os.path.ismount(self.data):
            subprocess.run(["umount", str(self.data)], capture_output=True, check=True)
        shutil.rmtree(self.root)

    def _write_conf(self) -> None:
        conf = self.root / "conf"
        conf.mkdir(mode=0o755, exist_ok=True)
        if not (conf / "containers.conf").is_file() or (conf / "containers.conf").read_text() != CONTAINERS_CONF:
            staging = conf / f".containers.conf.{os.getpid()}"
            staging.write_text(CONTAINERS_CONF)
            staging.chmod(0o644)
            staging.replace(conf / "containers.conf")

    def base_store(self, image: str) -> Path:
        """The store `image` is loaded into, once."""
        return self.data / "bases" / hashlib.sha256(image.encode()).hexdigest()[:32]

    def has_base(self, image: str) -> bool:
        return self.base_store(image).with_suffix(".complete").exists()

    def new_build_dir(self, name: str) -> Path:
        """A fresh directory for one build (its context, storage and archive), the box's to write."""
        directory = self.data / "builds" / f"{name}-{os.getpid()}-{os.urandom(4).hex()}"
        directory.mkdir(mode=0o700)
        os.lchown(directory, BUILD_UID, BUILD_UID)
        return directory

    def hand_over(self, path: Path) -> None:
        """Give a tree we staged to the box's root."""
        os.lchown(path, BUILD_UID, BUILD_UID)
        for directory, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(directory, name), BUILD_UID, BUILD_UID)

    def run(
        self,
        args: list[str],
        timeout_s: float,
        *,
        what: str,
        store: Bind,
        image_stores: tuple[Bind, ...] = (),
        inputs: tuple[Bind, ...] = (),
        limits: ResourceLimits = BUILD_LIMITS,
        ok: tuple[int, ...] = (0,),
        on_line: OnLine | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`podman args` in the box, its container storage in `store` and the read-only `image_stores` beside it,
        `inputs` at their places and nothing else of the box's, under `limits` (when a cgroup is writable) and a
        deadline; each line it prints to `on_line` as it comes, when given."""
        version = cgroup.detect()
        group = cgroup.Cgroup(f"build-{os.getpid()}-{id(args):x}", version) if version else None
        scratch = self._scratch(store, [bind.inside for bind in image_stores])
        binds = (store, *image_stores, *inputs, Bind(scratch, SCRATCH, writable=True))
        if group is not None:
            group.create(cgroup.Limits(limits.memory_mb << 20, limits.max_processes, limits.cpus))
        try:
            argv = [*cgroup.cgroup_prefix(group), *self._argv(args, binds)]
            completed = run_group(argv, timeout_s, env=_clean_env(), what=what, on_line=on_line)
        finally:
            if group is not None:
                group.destroy()
            shutil.rmtree(scratch, ignore_errors=True)
        if completed.returncode not in ok:
            raise BoxError(f"{what}: podman {args[0]} exited {completed.returncode}: {tail(completed.stderr)}")
        return completed

    def _scratch(self, store: Bind, read_only_stores: list[str]) -> Path:
        """One podman call's own HOME, TMPDIR and storage.conf, removed after it: buildah keeps `RUN
        --mount=type=cache` mounts under TMPDIR, and a cache one task's build filled must never be what another
        task's build reads."""
        scratch = self.data / "tmp" / f"{os.getpid()}-{os.urandom(6).hex()}"
        scratch.mkdir(mode=0o700)
        stores = ", ".join(f'"{inside}/storage"' for inside in read_only_stores)
        (scratch / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{store.inside}/storage"\nrunroot = "{SCRATCH}/run"\n'
            f"[storage.options]\nadditionalimagestores = [{stores}]\n"
            '[storage.options.overlay]\nmount_program = ""\nmountopt = "nodev"\n'
        )
        self.hand_over(scratch)
        return scratch

    def _argv(self, args: list[str], binds: tuple[Bind, ...]) -> list[str]:
        maps = ["--map", f"0:{BUILD_UID}:{BUILD_IDS}", "--gid", "0", "--"]
        limits = ["prlimit", f"--fsize={MAX_FILE_BYTES}", "--core=0", "--"]
        return [*limits, sys.executable, "-I", "-S", userns.__file__, *maps, *self._bwrap(binds), *self._podman(args)]

    def _bwrap(self, binds: tuple[Bind, ...]) -> list[str]:
        argv = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        argv += ["--die-with-parent", "--new-session"]
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        argv += ["--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
        for path in ("/tmp", "/run", "/var"):
            argv += ["--tmpfs", path, "--chmod", "1777", path]
        argv += ["--dir", "/var/tmp", "--chmod", "1777", "/var/tmp"]
        argv += ["--tmpfs", BOX, "--ro-bind", str(self.root / "conf"), f"{BOX}/conf"]
        for bind in binds:
            argv += ["--bind" if bind.writable else "--ro-bind", str(bind.host), bind.inside]
        return [*argv, "--chdir", SCRATCH, "--"]

    def _podman(self, args: list[str]) -> list[str]:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": SCRATCH,
            "TMPDIR": SCRATCH,
            "XDG_RUNTIME_DIR": f"{SCRATCH}/run",
            "CONTAINERS_CONF": f"{BOX}/conf/containers.conf",
            "CONTAINERS_STORAGE_CONF": f"{SCRATCH}/storage.conf",
        }
        return ["env", "-i", *(f"{k}={v}" for k, v in env.items()), self.podman, *args]


def run_group(
    argv: list[str],
    timeout_s: float,
    *,
    env: dict[str, str] | None,
    what: str,
    stdin: int | IO[bytes] | None = None,
    on_line: OnLine | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv in its own process group, which is stopped whole on timeout (podman build leaves children): SIGTERM
    first so podman can remove its build container, then SIGKILL. With `on_line`, each line of its stdout and stderr
    goes there as it is printed (and is kept for the result as well). `env` None: this process's own (the host's
    podman calls on its own storage; a call in the box always gets `_clean_env`)."""
    if on_line is not None:
        return _run_group_streaming(argv, timeout_s, env=env, what=what, stdin=stdin, on_line=on_line)
    with _popen(argv, env, stdin) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stderr = _stop_group(process)
            raise BoxError(f"{what}: podman timed out after {timeout_s:g} s: {tail(stderr)}") from None
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _popen(argv: list[str], env: dict[str, str] | None, stdin: int | IO[bytes] | None) -> subprocess.Popen[str]:
    """argv in a process group of its own (stopped whole), both pipes as text."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    )


def _run_group_streaming(
    argv: list[str],
    timeout_s: float,
    *,
    env: dict[str, str] | None,
    what: str,
    stdin: int | IO[bytes] | None,
    on_line: OnLine,
) -> subprocess.CompletedProcess[str]:
    """run_group, reading both pipes line by line in threads (a pipe read whole at the end would hide a build's
    steps until it ends)."""
    with _popen(argv, env, stdin) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        stdout: list[str] = []
        stderr: list[str] = []
        readers = [
            threading.Thread(target=_read_lines, args=(pipe, kept, on_line), daemon=True)
            for pipe, kept in ((process.stdout, stdout), (process.stderr, stderr))
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + timeout_s
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for signal_number in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):  # the group is already gone: what we wanted
                    os.killpg(process.pid, signal_number)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=TERMINATE_GRACE_S)
                    break
            _join(readers, TERMINATE_GRACE_S)
            raise BoxError(f"{what}: podman timed out after {timeout_s:g} s: {tail(''.join(stderr))}") from None
        _join(readers, max(TERMINATE_GRACE_S, deadline - time.monotonic()))
    return subprocess.CompletedProcess(argv, process.returncode, "".join(stdout), "".join(stderr))


def _read_lines(pipe: IO[str], kept: list[str], on_line: OnLine) -> None:
    """Every line kept; each passed on until `on_line` fails once (logged), and the pipe drained to its end either
    way, so that podman never blocks on a full pipe."""
    listening = True
    for line in pipe:
        kept.append(line)
        if listening:
            try:
                on_line(line.rstrip("\n"))
            except Exception:
                log.exception("a build's progress callback failed; its later lines are not passed on")
                listening = False


def _join(threads: list[threading.Thread], timeout_s: float) -> None:
    """Wait for the readers; a child outside the group holding a pipe open cannot keep us past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


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


def _clean_env() -> dict[str, str]:
    """Nothing of the server's environment (its keys) reaches the box."""
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= STDERR_TAIL_CHARS else "..." + text[-STDERR_TAIL_CHARS:]
