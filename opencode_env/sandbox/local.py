"""The embedded local backend: one directory per rollout, mounted at /home/user inside bubblewrap.

Each command runs in its own process group and its own PID namespace, so killing the group (or the sandbox) ends
every process the command started. The environment is rebuilt from an allowlist: nothing of the server's own
environment (its API keys above all) reaches a task. Without bubblewrap the backend refuses to run unless the
caller opts in to `isolation="none"`, where commands run directly in the rollout directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Literal

from opencode_env.models import CommandResult
from opencode_env.sandbox.base import (
    AGENT_LOG_DIR,
    DEFAULT_MAX_OUTPUT_BYTES,
    HOME,
    VERIFIER_DIR,
    WORKDIR,
    CloseOnce,
    FileEntry,
    OpenSandboxes,
    ProvidedTools,
    SandboxError,
    SandboxSpec,
)
from opencode_env.sandbox.output import BoundedOutput

Isolation = Literal["bwrap", "none"]
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Which certificates to trust is machine configuration, not a secret: tasks that install packages need it.
TRUST_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
PIPE_DRAIN_S = 2.0
INSTALL_HINT = (
    "bubblewrap (bwrap) is not installed; the local backend needs it to isolate rollouts. "
    "Install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`, "
    "or opt in to running commands unisolated with OPENCODE_ENV_LOCAL_ISOLATION=none."
)

ToolsResolver = Callable[[], Awaitable[ProvidedTools]]


class LocalProcess:
    """A process started in a local sandbox, led by its own process group."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def process(self) -> asyncio.subprocess.Process:
        return self._process

    async def running(self) -> bool:
        return self._process.returncode is None

    async def kill(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            await self._process.wait()


def _hidden_roots() -> list[str]:
    """Host directories a sandbox must not see; the rollout's own directories are mounted over them."""
    roots = ["/home", "/tmp", "/run", "/var/tmp"]
    host_home = os.path.expanduser("~")
    if host_home not in ("/", "") and not any(host_home.startswith(root + "/") for root in roots):
        roots.append(host_home)
    return roots


def _runtime_paths(tools: ProvidedTools) -> list[str]:
    """Host paths a sandbox needs to see even when they live under a hidden root (interpreters, OpenCode)."""
    paths = {sys.base_prefix, sys.prefix, str(Path(__file__).resolve().parents[2])}
    if tools.python:
        paths.add(str(Path(tools.python).parent.parent))
    if tools.opencode:
        paths.add(_install_root(tools.opencode))
    return sorted(paths)


def _install_root(binary: str) -> str:
    """The npm prefix an installed binary lives in (the directory above node_modules), else its directory."""
    resolved = Path(binary).resolve()
    for parent in resolved.parents:
        if parent.name == "node_modules":
            return str(parent.parent)
    return str(resolved.parent)


def trust_settings(host_env: Mapping[str, str]) -> dict[str, str]:
    """The host's CA-bundle settings, also given to npm (whose own config file is hidden with the host home)."""
    settings = {name: host_env[name] for name in TRUST_VARS if host_env.get(name)}
    bundle = settings.get("NODE_EXTRA_CA_CERTS") or settings.get("SSL_CERT_FILE")
    if bundle:
        settings["NPM_CONFIG_CAFILE"] = bundle
    return settings


class LocalSandbox:
    backend = "local"

    def __init__(
        self,
        root: Path,
        *,
        isolation: Isolation,
        tools: ProvidedTools,
        env: Mapping[str, str],
        extra_path: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.sandbox_id = f"local-{root.name}"
        self.tools = tools
        self._isolation = isolation
        self._base_env = dict(env)
        self._extra_path = extra_path
        self._processes: set[LocalProcess] = set()
        self.on_close: Callable[[LocalSandbox], None] | None = None
        self._closer = CloseOnce(self._close)

    def host_path(self, path: str) -> Path:
        """Where a sandbox path (absolute /home/user/..., or relative to the work dir) lives on the host."""
        absolute = path if path.startswith("/") else f"{WORKDIR}/{path}"
        normal = os.path.normpath(absolute)
        if normal == HOME or normal.startswith(HOME + "/"):
            return self.root / "home" / "user" / os.path.relpath(normal, HOME)
        if normal == "/tmp" or normal.startswith("/tmp/"):
            return self.root / "tmp" / os.path.relpath(normal, "/tmp")
        raise SandboxError(f"path {path!r} is outside the sandbox's writable area ({HOME} and /tmp)")

    def _environment(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        path = ":".join([*self._extra_path, BASE_PATH])
        if self.tools.opencode:
            path = f"{Path(self.tools.opencode).parent}:{path}"
        home = HOME if self._isolation == "bwrap" else str(self.host_path(HOME))
        tmp = "/tmp" if self._isolation == "bwrap" else str(self.host_path("/tmp"))
        env = {"PATH": path, "HOME": home, "USER": "user", "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": tmp}
        env.update(trust_settings(os.environ))
        env.update(self._base_env)
        env.update(extra or {})
        return env

    def _argv(self, cmd: str, cwd: str) -> tuple[list[str], str | None]:
        if self._isolation == "none":
            return ["/bin/bash", "-c", cmd], str(self.host_path(cwd))
        argv = [
            "bwrap",
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
        ]
        for root in _hidden_roots():
            if os.path.isdir(root):
                argv += ["--tmpfs", root]
        argv += ["--bind", str(self.root / "home" / "user"), HOME, "--bind", str(self.root / "tmp"), "/tmp"]
        # Bound last, so that the rollout's own /home/user and /tmp do not shadow them.
        shadowed = [*_hidden_roots(), HOME]
        for path in _runtime_paths(self.tools):
            if any(path == root or path.startswith(root + "/") for root in shadowed):
                argv += ["--ro-bind", path, path]
        argv += ["--chdir", cwd, "--", "/bin/bash", "-c", cmd]
        return argv, None

    async def _spawn(
        self, cmd: str, cwd: str, env: Mapping[str, str] | None, stdout: int, stderr: int
    ) -> asyncio.subprocess.Process:
        if self._closer.started:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")
        argv, host_cwd = self._argv(cmd, cwd)
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=host_cwd,
            env=self._environment(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )

    async def run(
        self,
        cmd: str,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKDIR,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> CommandResult:
        started = time.monotonic()
        process = await self._spawn(cmd, cwd, env, subprocess.PIPE, subprocess.PIPE)
        handle = LocalProcess(process)
        self._processes.add(handle)
        outputs = (BoundedOutput(max_output_bytes), BoundedOutput(max_output_bytes))
        assert process.stdout is not None
        assert process.stderr is not None
        readers = [
            asyncio.ensure_future(_drain(stream, out))
            for stream, out in zip((process.stdout, process.stderr), outputs, strict=True)
        ]
        timed_out = False
        try:
            await asyncio.wait_for(process.wait(), timeout=max(timeout_s, 0.001))
        except TimeoutError:
            timed_out = True
        finally:
            await handle.kill()
            self._processes.discard(handle)
            _, pending = await asyncio.wait(readers, timeout=PIPE_DRAIN_S)
            for reader in pending:
                reader.cancel()
        stdout, stderr = outputs
        return CommandResult(
            cmd=cmd,
            exit_code=None if timed_out else process.returncode,
            stdout=stdout.text(),
            stderr=stderr.text(),
            duration_s=round(time.monotonic() - started, 4),
            timed_out=timed_out,
            output_truncated=stdout.truncated or stderr.truncated,
        )

    async def spawn(self, cmd: str, *, env: Mapping[str, str] | None = None, cwd: str = WORKDIR) -> LocalProcess:
        """A process with piped stdout and stderr, owned (and killed on close) by the sandbox."""
        handle = LocalProcess(await self._spawn(cmd, cwd, env, subprocess.PIPE, subprocess.PIPE))
        self._processes.add(handle)
        return handle

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> LocalProcess:
        log_file = self.host_path(log_path)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:
            process = await self._spawn(cmd, cwd, env, log.fileno(), subprocess.STDOUT)
        handle = LocalProcess(process)
        self._processes.add(handle)
        return handle

    async def write_file(self, path: str, data: str | bytes) -> None:
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)

    async def read_file(self, path: str) -> bytes:
        target = self.host_path(path)
        if not target.is_file():
            raise FileNotFoundError(path)
        return target.read_bytes()

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        base = self.host_path(root)
        entries: list[FileEntry] = []
        for directory, subdirs, names in os.walk(base):
            subdirs.sort()
            for name in sorted(names):
                full = Path(directory) / name
                if full.is_symlink() or not full.is_file():
                    continue
                entries.append(FileEntry(str(full.relative_to(base)), full.stat().st_size))
                if len(entries) >= limit:
                    return entries
        return entries

    async def close(self) -> None:
        await self._closer()

    async def _close(self) -> None:
        try:
            for process in list(self._processes):
                await process.kill()
            self._processes.clear()
            await asyncio.to_thread(shutil.rmtree, self.root, True)
        finally:
            if self.on_close is not None:
                self.on_close(self)


async def _drain(stream: asyncio.StreamReader, out: BoundedOutput) -> None:
    while chunk := await stream.read(65536):
        out.feed(chunk)


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def isolation_from_env() -> Isolation:
    value = os.environ.get("OPENCODE_ENV_LOCAL_ISOLATION", "bwrap")
    if value not in ("bwrap", "none"):
        raise SandboxError(f"OPENCODE_ENV_LOCAL_ISOLATION must be 'bwrap' or 'none', not {value!r}")
    return "none" if value == "none" else "bwrap"


class LocalBackend:
    """Creates local sandboxes; the OpenCode binary is installed once per machine by `tools_resolver`."""

    name = "local"

    def __init__(
        self,
        tools_resolver: ToolsResolver,
        *,
        isolation: Isolation | None = None,
        base_dir: Path | None = None,
        extra_path: tuple[str, ...] = (),
    ) -> None:
        self._tools_resolver = tools_resolver
        self._extra_path = extra_path
        self._open = OpenSandboxes()
        self._isolation: Isolation = isolation or isolation_from_env()
        self._base_dir = base_dir

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        if self._isolation == "bwrap" and not bwrap_available():
            raise SandboxError(INSTALL_HINT)
        tools = await self._tools_resolver()
        root = Path(tempfile.mkdtemp(prefix=f"opencode-env-{uuid.uuid4().hex[:8]}-", dir=self._base_dir))
        for sub in (WORKDIR, VERIFIER_DIR, AGENT_LOG_DIR):
            (root / sub.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir()
        sandbox = LocalSandbox(root, isolation=self._isolation, tools=tools, env=spec.env, extra_path=self._extra_path)
        sandbox.on_close = self._open.discard
        self._open.add(sandbox)
        return sandbox

    async def close_all(self) -> int:
        return await self._open.close_all()
