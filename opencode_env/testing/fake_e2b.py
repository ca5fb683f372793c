"""A stand-in for E2B's `AsyncSandbox` that runs commands for real, in local bubblewrap sandboxes.

It has the SDK's method names and signatures (a test compares them with the installed SDK, so it cannot drift)
and raises the SDK's real exception classes: `CommandExitException` for a non-zero exit, `TimeoutException` when a
command outlives its `timeout` (60 s by default, background commands included, as in the SDK),
`FileNotFoundException`, `AuthenticationException`, `RateLimitException`, `SandboxException` with a status code.
A `FakeCloud` holds what the E2B API would: live sandboxes, templates, the valid key, the concurrency cap and
failure switches.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import itertools
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
from e2b import (
    AuthenticationException,
    CommandExitException,
    CommandResult,
    FileNotFoundException,
    RateLimitException,
    SandboxException,
    ServiceBusyException,
    TimeoutException,
)
from e2b.api.client.models.sandbox_state import SandboxState
from e2b.sandbox.filesystem.filesystem import EntryInfo, FileType, WriteInfo
from e2b.sandbox.sandbox_api import SandboxInfo, SandboxQuery

from opencode_env.sandbox.base import HOME, WORKDIR, Identity, ProvidedTools, SandboxSpec
from opencode_env.sandbox.local.services import (
    HOST_IMAGE,
    LocalBackend,
    LocalProcess,
    LocalSandbox,
    cached_tools,
    npm_cache,
)
from opencode_env.wire import TEMPLATE_FORMAT, TEMPLATE_FORMAT_ENV_NAME

Output = Callable[[str], None] | Callable[[str], Awaitable[None]] | None
NPM_GLOBAL = f"{HOME}/.npm-global"


def host_path(sandbox: LocalSandbox, path: str) -> Path:
    """Where a path in a local sandbox's home or /tmp lives on the host, from the sandbox's public layout: for tests
    and the fakes that emulate a cloud VM with a local sandbox. Where the product reads or writes a sandbox's tree it
    goes through hostfs (no link followed); a test that opens this path must not stand in for that."""
    normal = os.path.normpath(path if path.startswith("/") else f"{WORKDIR}/{path}")
    if normal == HOME or normal.startswith(HOME + "/"):
        return sandbox.layout.home / os.path.relpath(normal, HOME)
    if normal == "/tmp" or normal.startswith("/tmp/"):
        return sandbox.layout.tmp / os.path.relpath(normal, "/tmp")
    raise ValueError(f"{path!r} is outside the sandbox's home and /tmp")


@dataclass
class FakeCloud:
    """The E2B API as the fake sees it. Templates map a name to whether it has OpenCode baked in."""

    base_dir: Path | None = None
    api_key: str = "e2b_fake_key"
    templates: dict[str, bool] = field(default_factory=lambda: {"opencode-env": True, "base": False})
    outdated_templates: set[str] = field(default_factory=set)
    """Templates with OpenCode that an older opencode-env built (no current template format)."""
    max_sandboxes: int = 20
    unreachable: bool = False
    busy: bool = False
    create_delay_s: float = 0.0
    command_delay_s: float = 0.0
    command_failure: bool = False
    alive: dict[str, FakeAsyncSandbox] = field(default_factory=dict)
    created: int = 0
    creating: int = 0
    """Creations begun (counted before `create_delay_s`): a test cancels one in flight once this counts it."""

    def sandbox_class(self) -> type[FakeAsyncSandbox]:
        return type("BoundFakeAsyncSandbox", (FakeAsyncSandbox,), {"cloud": self})

    async def local_sandbox(self, with_opencode: bool, outdated: bool = False) -> LocalSandbox:
        async def tools() -> ProvidedTools:
            provided = await cached_tools()
            return ProvidedTools(opencode=provided.opencode if with_opencode else None)

        venv_bin = str(Path(sys.executable).parent)
        backend = LocalBackend(
            tools,
            base_dir=self.base_dir,
            extra_path=(venv_bin,),
            sandbox_path=(f"{NPM_GLOBAL}/bin",),
            share_host_network=True,
        )
        env = {"NPM_CONFIG_PREFIX": NPM_GLOBAL}
        if with_opencode and not outdated:
            env[TEMPLATE_FORMAT_ENV_NAME] = TEMPLATE_FORMAT
        if not with_opencode:
            # A template without OpenCode installs it at run time: from a warm npm cache, offline, so the test
            # proves the install path without depending on the registry.
            env |= {"NPM_CONFIG_CACHE": f"{HOME}/.npm", "NPM_CONFIG_OFFLINE": "true"}
        sandbox = await backend.create(SandboxSpec(env=env, image=HOST_IMAGE))
        if not with_opencode:
            await asyncio.to_thread(_copy_owned, npm_cache(), host_path(sandbox, f"{HOME}/.npm"), sandbox.owner)
        return sandbox


def _copy_owned(source: Path, target: Path, owner: tuple[int, int]) -> None:
    shutil.copytree(source, target, symlinks=True)
    for directory, _, files in os.walk(target):
        os.chown(directory, *owner)
        for name in files:
            os.chown(os.path.join(directory, name), *owner)


class FakeCommandHandle:
    def __init__(self, process: LocalProcess, on_stdout: Output, on_stderr: Output, retain: bool) -> None:
        self._process = process
        self.pid = process.pid
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._pumps = [
            asyncio.ensure_future(self._pump(process.process.stdout, on_stdout, self._stdout, retain)),
            asyncio.ensure_future(self._pump(process.process.stderr, on_stderr, self._stderr, retain)),
        ]
        self.exit_code: int | None = None

    @staticmethod
    async def _pump(stream: asyncio.StreamReader | None, callback: Output, kept: list[str], retain: bool) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            text = chunk.decode("utf-8", errors="replace")
            if retain:
                kept.append(text)
            if callback is not None:
                outcome = callback(text)
                if outcome is not None:
                    await outcome

    async def wait(self) -> CommandResult[str]:
        code = await self._process.process.wait()
        await asyncio.gather(*self._pumps)
        self.exit_code = code
        stdout, stderr = "".join(self._stdout), "".join(self._stderr)
        if code != 0:
            raise CommandExitException(stderr=stderr, stdout=stdout, exit_code=code, error=None)
        return CommandResult(stderr=stderr, stdout=stdout, exit_code=code, error=None)

    async def kill(self) -> bool:
        running = await self._process.running()
        await self._process.kill()
        return running

    async def disconnect(self) -> None:
        for pump in self._pumps:
            pump.cancel()


def _identity(user: str | None) -> Identity:
    """The VM's users as the local sandbox's identities (a VM's root can hand files between user and grader)."""
    if user == "root":
        return "root"
    return "grader" if user == "grader" else "user"


class FakeCommands:
    def __init__(self, sandbox: LocalSandbox, cloud: FakeCloud) -> None:
        self._sandbox = sandbox
        self._cloud = cloud
        self._handles: dict[int, FakeCommandHandle] = {}

    async def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Output = None,
        on_stderr: Output = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> Any:
        if self._cloud.command_delay_s:
            await asyncio.sleep(self._cloud.command_delay_s)
        if self._cloud.command_failure:
            raise SandboxException("the sandbox's agent did not answer (fake outage)")
        # One pid namespace for the VM: what a command leaves running lives on, and every process sees the rest. The
        # grader's commands keep their own, in which the local sandbox mounts the grader's fresh /tmp.
        identity = _identity(user)
        process = await self._sandbox.spawn(
            cmd, env=envs, cwd=cwd or HOME, identity=identity, own_pid_namespace=identity == "grader"
        )
        handle = FakeCommandHandle(process, on_stdout, on_stderr, retain_output)
        self._handles[handle.pid] = handle
        if timeout:
            asyncio.get_running_loop().call_later(timeout, lambda: asyncio.ensure_future(handle.kill()))
        if background:
            return handle
        try:
            return await asyncio.wait_for(handle.wait(), timeout=timeout or None)
        except TimeoutError as error:
            await handle.kill()
            raise TimeoutException(f"command timed out after {timeout}s") from error

    async def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        handle = self._handles.get(pid)
        return await handle.kill() if handle else False


class FakeFilesystem:
    def __init__(self, sandbox: LocalSandbox) -> None:
        self._sandbox = sandbox

    async def write(
        self,
        path: str,
        data: str | bytes,
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
        use_octet_stream: bool | None = None,
        metadata: dict[str, str] | None = None,
    ) -> WriteInfo:
        await self._sandbox.write_machine_file(path, data, identity=_identity(user))
        return WriteInfo(name=os.path.basename(path), type=FileType.FILE, path=path)

    async def read(
        self,
        path: str,
        format: Literal["text", "bytes", "stream"] = "text",
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
        stream_idle_timeout: float | None = None,
    ) -> Any:
        try:
            data = await self._sandbox.read_file(path)
        except FileNotFoundError as missing:
            raise FileNotFoundException(f"file {path} not found") from missing
        return data.decode("utf-8") if format == "text" else bytearray(data)

    async def list(
        self, path: str, depth: int | None = 1, user: str | None = None, request_timeout: float | None = None
    ) -> list[EntryInfo]:
        base = host_path(self._sandbox, path)
        if not base.is_dir():
            raise FileNotFoundException(f"directory {path} not found")
        entries = []
        for host in sorted(base.rglob("*")):
            relative = host.relative_to(base)
            if (depth is not None and len(relative.parts) > depth) or host.is_symlink():
                continue
            stat = host.stat()
            entries.append(
                EntryInfo(
                    name=host.name,
                    type=FileType.DIR if host.is_dir() else FileType.FILE,
                    path=f"{path.rstrip('/')}/{relative}",
                    size=stat.st_size,
                    mode=stat.st_mode,
                    permissions="",
                    owner="user",
                    group="user",
                    modified_time=datetime.datetime.fromtimestamp(stat.st_mtime, datetime.UTC),
                )
            )
        return entries


class FakePaginator:
    def __init__(self, items: list[SandboxInfo]) -> None:
        self._items: list[SandboxInfo] | None = items
        self.next_token: str | None = None

    @property
    def has_next(self) -> bool:
        return self._items is not None

    async def next_items(self) -> list[SandboxInfo]:
        items, self._items = self._items or [], None
        return items


class _InstanceOrClass:
    """Like the SDK's `kill`: on an instance it kills that sandbox; on the class it takes a sandbox id."""

    def __init__(self, on_instance: Callable[..., Any], on_class: Callable[..., Any]) -> None:
        self._on_instance, self._on_class = on_instance, on_class

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        if obj is not None:
            return functools.partial(self._on_instance, obj)
        return functools.partial(self._on_class, owner)


async def _kill_instance(box: FakeAsyncSandbox, **opts: Any) -> bool:
    # Gone from the listing only once its processes and files are, as a killed sandbox is.
    if box.sandbox_id not in box.cloud.alive:
        return False
    await box._local.close()
    box.cloud.alive.pop(box.sandbox_id, None)
    return True


async def _kill_by_id(cls: type[FakeAsyncSandbox], sandbox_id: str, **opts: Any) -> bool:
    box = cls.cloud.alive.get(sandbox_id)
    return await _kill_instance(box) if box else False


class FakeAsyncSandbox:
    cloud: ClassVar[FakeCloud]
    _ids = itertools.count(1)

    def __init__(self, sandbox_id: str, local: LocalSandbox, template: str, metadata: dict[str, str]) -> None:
        self.sandbox_id = sandbox_id
        self._local = local
        self._template = template
        self._metadata = metadata
        self._started = datetime.datetime.now(datetime.UTC)
        self.commands = FakeCommands(local, self.cloud)
        self.files = FakeFilesystem(local)

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,
        metadata: dict[str, str] | None = None,
        envs: dict[str, str] | None = None,
        secure: bool | None = None,
        allow_internet_access: bool | None = None,
        mcp: Any = None,
        network: Any = None,
        iam: Any = None,
        lifecycle: Any = None,
        volume_mounts: Any = None,
        logger: Any = None,
        idempotency_key: str | None = None,
        **opts: Any,
    ) -> FakeAsyncSandbox:
        cloud = cls.cloud
        if not opts.get("api_key"):
            raise AuthenticationException("API key is required, please visit the Team tab at https://e2b.dev")
        if cloud.unreachable:
            raise httpx.ConnectError("[Errno 111] Connection refused")
        if opts["api_key"] != cloud.api_key:
            raise AuthenticationException("Invalid API key")
        if cloud.busy:
            raise ServiceBusyException("service is busy")
        name = template or "base"
        if name not in cloud.templates:
            raise SandboxException(f"template '{name}' not found", status_code=404)
        if len(cloud.alive) >= cloud.max_sandboxes:
            raise RateLimitException("rate limit exceeded: too many concurrent sandboxes")  # type: ignore[no-untyped-call]
        cloud.creating += 1
        if cloud.create_delay_s:
            await asyncio.sleep(cloud.create_delay_s)
        local = await cloud.local_sandbox(
            with_opencode=cloud.templates[name], outdated=name in cloud.outdated_templates
        )
        sandbox = cls(f"fake{next(cls._ids):05d}", local, name, dict(metadata or {}))
        cloud.alive[sandbox.sandbox_id] = sandbox
        cloud.created += 1
        return sandbox

    kill = _InstanceOrClass(_kill_instance, _kill_by_id)

    async def set_timeout(self, timeout: int, **opts: Any) -> None:
        return None

    @classmethod
    def list(
        cls,
        query: SandboxQuery | None = None,
        limit: int | None = None,
        next_token: str | None = None,
        order: Literal["asc", "desc"] | None = None,
        **opts: Any,
    ) -> FakePaginator:
        wanted = (query.metadata if query else None) or {}
        infos = [
            SandboxInfo(
                sandbox_id=box.sandbox_id,
                sandbox_domain=None,
                template_id=box._template,
                name=None,
                metadata=box._metadata,
                started_at=box._started,
                end_at=box._started,
                state=SandboxState.RUNNING,
                cpu_count=2,
                memory_mb=512,
                envd_version="fake",
            )
            for box in cls.cloud.alive.values()
            if all(box._metadata.get(key) == value for key, value in wanted.items())
        ]
        return FakePaginator(infos)


async def close_all(cloud: FakeCloud) -> None:
    for box in list(cloud.alive.values()):
        with contextlib.suppress(SandboxException):
            await box.kill()
