"""A stand-in for huggingface_hub's dedicated `Sandbox` (and the two `HfApi` calls the reaper makes) that runs
commands for real: by default each sandbox in a local bubblewrap sandbox, or, with `plain_processes`, as plain
processes of this machine, which then plays the one sandbox's VM (for the image's smoke test: fake_hf_plain.py).

Like the SDK it is synchronous; like the HF Jobs it stands for, its sandboxes live elsewhere: on the fake cloud's
own event loop, in its own thread, so a call blocks its caller the way a remote call does. It has the SDK's method
names and signatures (a test compares them with the installed SDK) and raises the SDK's own exception types:
`SandboxError` (no token, a sandbox that does not start, a connection lost when the sandbox is killed under a
command), `SandboxCommandError` (check=True), `HfHubHTTPError` with the status the Jobs API answers (401, 402,
429) and httpx2's `ConnectError` when the API is unreachable. Its "images" are directories of stand-ins for what
nothing: the local sandbox's root maps the VM's users, so the backend's drops to them are real.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
import shlex
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Protocol, TypeVar

import httpx2
from huggingface_hub import JobInfo
from huggingface_hub._sandbox import DEFAULT_IMAGE, RESERVED_SANDBOX_LABELS, SandboxCommandResult
from huggingface_hub.errors import HfHubHTTPError, SandboxCommandError, SandboxError

from opencode_env.sandbox.base import Identity, ProvidedTools, SandboxSpec
from opencode_env.sandbox.local.services import HOST_IMAGE, LocalBackend, LocalProcess, LocalSandbox, cached_tools
from opencode_env.testing.fake_hf_plain import PlainMachine
from opencode_env.testing.fake_vm import as_a_vm

T = TypeVar("T")
# The fake cannot write /opt: where the backend keeps its root-owned tools and control files in a fake sandbox.
FAKE_TOOLS_DIR = "/tmp/opencode-env"
OWNER = {"id": "0123456789abcdef", "name": "fake-user", "type": "user"}


class MachineProcess(Protocol):
    """A command running in a fake sandbox, led by its own process group."""

    @property
    def pid(self) -> int: ...

    @property
    def process(self) -> asyncio.subprocess.Process: ...

    async def running(self) -> bool: ...

    async def kill(self) -> None: ...


class Machine(Protocol):
    """What a fake sandbox runs on: a local bubblewrap sandbox (`LocalSandbox`) or this machine (`PlainMachine`)."""

    async def spawn(self, cmd: str, *, env: Mapping[str, str] | None = None, cwd: str = ...) -> MachineProcess: ...

    async def write_file(self, path: str, data: str | bytes) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def close(self) -> None: ...


def _http_error(status: int, message: str) -> HfHubHTTPError:
    request = httpx2.Request("POST", "https://huggingface.co/api/jobs/fake-user")
    return HfHubHTTPError(f"{status} {message}", response=httpx2.Response(status, request=request))


@dataclass
class FakeHfCloud:
    """HF Jobs as the fake sees it. Images map a name to whether OpenCode is baked in (in bubblewrap mode; in plain
    mode every image is this machine, with what it has)."""

    base_dir: Path | None = None
    token: str = "hf_fake_token"
    images: dict[str, bool] = field(default_factory=lambda: {"opencode-env": True, "python:3.12": False})
    user_images: set[str] = field(default_factory=set)
    """Images that set USER: their sandbox server, and every command it runs, is not root (bubblewrap mode only)."""
    plain_processes: bool = False
    """Run a sandbox's commands as plain processes of this machine, as whoever runs the fake (root, for a real drop
    to `user`), in this process's environment: the machine plays the VM of one sandbox at a time."""
    max_jobs: int = 20
    unreachable: bool = False
    payment_required: bool = False
    create_delay_s: float = 0.0
    alive: dict[str, FakeSandbox] = field(default_factory=dict)
    jobs: dict[str, JobInfo] = field(default_factory=dict)
    created: int = 0
    creating: int = 0
    """Creations begun (counted before `create_delay_s`): a test cancels one in flight once this counts it."""
    _loop: asyncio.AbstractEventLoop | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def remote(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the cloud's own loop and wait for it, as a remote call waits for its server."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=_serve, args=(loop,), name="fake-hf-cloud", daemon=True).start()
                weakref.finalize(self, loop.call_soon_threadsafe, loop.stop)
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def sandbox_class(self) -> type[FakeSandbox]:
        return type("BoundFakeSandbox", (FakeSandbox,), {"cloud": self})

    def api(self) -> FakeHfApi:
        return FakeHfApi(self)

    def kill_all(self) -> None:
        for box in list(self.alive.values()):
            box.kill()

    async def machine(self, with_opencode: bool, *, user_image: bool = False) -> Machine:
        if self.plain_processes:
            return PlainMachine(os.environ)

        async def tools() -> ProvidedTools:
            provided = await cached_tools()
            return ProvidedTools(opencode=provided.opencode if with_opencode else None)

        venv_bin = str(Path(sys.executable).parent)
        backend = LocalBackend(tools, base_dir=self.base_dir, extra_path=(venv_bin,), share_host_network=True)
        machine = await as_a_vm(await backend.create(SandboxSpec(image=HOST_IMAGE)))
        return ServerMachine(machine, identity="user" if user_image else "root")


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The cloud's loop, until the cloud is gone."""
    try:
        loop.run_forever()
    finally:
        loop.close()


class ServerMachine:
    """A local sandbox as an HF sandbox's VM: its server's commands run as the VM's root (the local sandbox's root,
    which maps `user` and `grader` too, so setpriv really drops to them), or as `user` for an image whose server
    runs unprivileged."""

    def __init__(self, sandbox: LocalSandbox, *, identity: Identity) -> None:
        self.sandbox = sandbox
        self._identity: Identity = identity

    async def spawn(self, cmd: str, *, env: Mapping[str, str] | None = None, cwd: str = "/") -> LocalProcess:
        return await self.sandbox.spawn(cmd, env=env, cwd=cwd, identity=self._identity)

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self.sandbox.write_machine_file(path, data, identity=self._identity)

    async def read_file(self, path: str) -> bytes:
        return await self.sandbox.read_file(path)

    async def close(self) -> None:
        await self.sandbox.close()


@dataclass
class FakeSandboxProcess:
    id: str | None
    pid: int
    cmd: str | list[str]
    _sandbox: FakeSandbox = field(repr=False, compare=False)
    tag: str | None = None
    started_at_ms: int | None = None
    running: bool = True
    exit_code: int | None = None

    def kill(self) -> bool:
        """Kill the process group; whether this call stopped it."""
        process = self._sandbox._background.get(self.id or "")
        if process is None:
            return False
        return self._sandbox.cloud.remote(_kill(process))


async def _kill(process: MachineProcess) -> bool:
    running = await process.running()
    await process.kill()
    return running


class _KillMethod:
    """Like the SDK's `kill`: on an instance it kills that sandbox; on the class it takes a sandbox id."""

    def __get__(self, instance: FakeSandbox | None, owner: type[FakeSandbox]) -> Callable[..., None]:
        if instance is not None:
            return instance._kill

        def kill(sandbox_id: str, *, namespace: str | None = None, token: str | None = None) -> None:
            box = owner.cloud.alive.get(sandbox_id)
            if box is not None:
                box._kill()

        return kill


class FakeSandbox:
    cloud: ClassVar[FakeHfCloud]
    _ids = itertools.count(1)

    def __init__(self, sandbox_id: str, machine: Machine, image_env: dict[str, str]) -> None:
        self.id = sandbox_id
        self._machine = machine
        self._image_env = image_env
        self._killed = False
        self._background: dict[str, MachineProcess] = {}
        self._commands: dict[str, str | list[str]] = {}
        self.files = FakeSandboxFiles(self)

    @classmethod
    def create(
        cls,
        image: str = DEFAULT_IMAGE,
        *,
        flavor: str = "cpu-basic",
        idle_timeout: int | float | str | None = 600,
        env: dict[str, Any] | None = None,
        secrets: dict[str, Any] | None = None,
        volumes: list[Any] | None = None,
        namespace: str | None = None,
        forward_hf_token: bool = False,
        labels: dict[str, str] | None = None,
        start_timeout: float = 120.0,
        token: str | None = None,
    ) -> FakeSandbox:
        cloud = cls.cloud
        if any(key in RESERVED_SANDBOX_LABELS for key in labels or {}):
            raise ValueError("Label is reserved by huggingface_hub Sandbox and cannot be overridden.")
        if not token:
            raise SandboxError("A Hugging Face token is required to use sandboxes. Run `hf auth login` first.")
        if cloud.unreachable:
            raise httpx2.ConnectError("[Errno 111] Connection refused")
        if token != cloud.token:
            raise _http_error(401, "Unauthorized: Invalid credentials in Authorization header")
        if cloud.payment_required:
            raise _http_error(402, "Payment Required: add a payment method to run Jobs")
        if len(cloud.alive) >= cloud.max_jobs:
            raise _http_error(429, "Too Many Requests: too many running jobs")
        if cloud.plain_processes and cloud.alive:
            raise _http_error(429, "Too Many Requests: a fake cloud of plain processes runs one sandbox at a time")
        job_id = f"fakejob{next(cls._ids):05d}"
        if image not in cloud.images:
            raise SandboxError(
                f"Sandbox job {job_id} terminated during startup (status: ERROR, message: image {image} not found)."
            )
        cloud.creating += 1
        if cloud.create_delay_s:
            time.sleep(cloud.create_delay_s)
        machine = cloud.remote(cloud.machine(with_opencode=cloud.images[image], user_image=image in cloud.user_images))
        box = cls(job_id, machine, {})
        cloud.alive[job_id] = box
        cloud.jobs[job_id] = JobInfo(
            id=job_id,
            created_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            docker_image=image,
            owner=OWNER,
            status={"stage": "RUNNING"},
            labels={**(labels or {}), "hf-sandbox": "1"},
            flavor=flavor,
        )
        cloud.created += 1
        return box

    kill = _KillMethod()

    def _kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        self.cloud.remote(self._machine.close())
        self.cloud.alive.pop(self.id, None)
        self.cloud.jobs.pop(self.id, None)

    def _require_alive(self) -> None:
        if self._killed:
            raise SandboxError(f"Sandbox API error (503): sandbox {self.id} is gone", status_code=503)

    def run(
        self,
        cmd: str | list[str],
        *,
        shell: bool | None = None,
        env: dict[str, Any] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        check: bool = True,
        capture_output: bool = True,
        background: bool = False,
    ) -> Any:
        self._require_alive()
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        environment = {**self._image_env, **{key: str(value) for key, value in (env or {}).items()}}
        if background:
            process = self.cloud.remote(self._machine.spawn(command, env=environment, cwd=cwd or "/"))
            process_id = uuid.uuid4().hex
            self._background[process_id] = process
            self._commands[process_id] = cmd
            return FakeSandboxProcess(id=process_id, pid=process.pid, cmd=cmd, _sandbox=self)
        result = self.cloud.remote(
            self._exec(command, environment, cwd or "/", timeout, stdin, on_stdout, on_stderr, capture_output)
        )
        if check and (result.exit_code != 0 or result.timed_out):
            raise SandboxCommandError(cmd=cmd, result=result)
        return result

    async def _exec(
        self,
        command: str,
        env: dict[str, str],
        cwd: str,
        timeout: float | None,
        stdin: str | None,
        on_stdout: Callable[[str], None] | None,
        on_stderr: Callable[[str], None] | None,
        capture_output: bool,
    ) -> SandboxCommandResult:
        if stdin is not None:
            fed = f"/tmp/.fake-sbx-stdin-{uuid.uuid4().hex}"
            await self._machine.write_file(fed, stdin)
            command = f"exec < {fed}; rm -f {fed}; {command}"
        started = time.monotonic()
        process = await self._machine.spawn(command, env=env, cwd=cwd)
        kept: tuple[list[str], list[str]] = ([], [])
        pumps = [
            asyncio.ensure_future(_pump(stream, callback, parts if capture_output else None))
            for stream, callback, parts in zip(
                (process.process.stdout, process.process.stderr), (on_stdout, on_stderr), kept, strict=True
            )
        ]
        timed_out = False
        try:
            await asyncio.wait_for(process.process.wait(), timeout=timeout)
        except TimeoutError:
            timed_out = True
            await process.kill()
        await asyncio.gather(*pumps)
        if self._killed:
            raise SandboxError("connection lost while running command")
        return SandboxCommandResult(
            exit_code=None if timed_out else process.process.returncode,
            stdout="".join(kept[0]),
            stderr="".join(kept[1]),
            signal=9 if timed_out else None,
            timed_out=timed_out,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    def processes(self) -> list[FakeSandboxProcess]:
        self._require_alive()
        return [
            FakeSandboxProcess(
                id=process_id,
                pid=process.pid,
                cmd=self._commands[process_id],
                _sandbox=self,
                running=process.process.returncode is None,
                exit_code=process.process.returncode,
            )
            for process_id, process in self._background.items()
        ]


async def _pump(
    stream: asyncio.StreamReader | None, callback: Callable[[str], None] | None, kept: list[str] | None
) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        text = chunk.decode("utf-8", errors="replace")
        if kept is not None:
            kept.append(text)
        if callback is not None:
            callback(text)


class FakeSandboxFiles:
    """The SDK's file API (it acts as root); the backend moves files through commands run as `user` instead."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox

    def write(self, path: str, data: str | bytes | BinaryIO, mode: str | None = None) -> None:
        self._sandbox._require_alive()
        payload = data if isinstance(data, (str, bytes)) else data.read()
        self._sandbox.cloud.remote(self._sandbox._machine.write_file(path, payload))

    def read(self, path: str) -> bytes:
        self._sandbox._require_alive()
        try:
            return self._sandbox.cloud.remote(self._sandbox._machine.read_file(path))
        except FileNotFoundError as missing:
            raise SandboxError(f"Sandbox API error (404): {path} not found", status_code=404) from missing


class FakeHfApi:
    def __init__(self, cloud: FakeHfCloud) -> None:
        self._cloud = cloud

    def list_jobs(
        self,
        *,
        status: list[str] | str | None = None,
        labels: dict[str, str] | None = None,
        timeout: int | None = None,
        namespace: str | None = None,
        token: bool | str | None = None,
    ) -> Iterable[JobInfo]:
        wanted = labels or {}
        return [
            job
            for job in list(self._cloud.jobs.values())
            if all((job.labels or {}).get(key) == value for key, value in wanted.items())
        ]

    def cancel_job(self, *, job_id: str, namespace: str | None = None, token: bool | str | None = None) -> None:
        box = self._cloud.alive.get(job_id)
        if box is None:
            raise _http_error(404, f"Job {job_id} not found")
        box._kill()
