"""The E2B backend: the same sandbox contract on E2B's `AsyncSandbox`. The only module that imports `e2b`.

SDK behaviour mapped here, at the edge: a non-zero exit (`CommandExitException`) is a result, never an error;
the SDK's 60 s default command timeout (which also kills background processes) is never inherited; every failure
of `create()` becomes one `SandboxError` that says what to do; a sandbox whose creation is cancelled half-way is
killed as soon as it exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    ServiceBusyException,
    TemplateException,
)
from e2b.sandbox.filesystem.filesystem import FileType

from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    OPENCODE_DATA_DIR,
    WORKDIR,
    CloseOnce,
    FileEntry,
    Identity,
    OpenSandboxes,
    ProvidedTools,
    ProxyLaunch,
    SandboxError,
    SandboxSpec,
    task_path,
)
from opencode_env.sandbox.cloud.admission import Admission, limit_from_env
from opencode_env.sandbox.cloud.grader import GRADER_ENV, GRADER_USER, handoff_script
from opencode_env.sandbox.cloud.root_proxy import RootProxy, start_root_proxy
from opencode_env.sandbox.output import BoundedOutput
from opencode_env.wire.models import CommandResult, LimitHit
from opencode_env.wire.pins import TEMPLATE_FORMAT, TEMPLATE_FORMAT_VAR

log = logging.getLogger("opencode_env.e2b")
DEFAULT_TEMPLATE = "opencode-env"
TASK_USER = "user"
CONTROL_DIR = "/home/user/.rollout"
TAG = "opencode_env"
MAX_SANDBOXES_VAR = "OPENCODE_ENV_E2B_MAX_SANDBOXES"
DEFAULT_MAX_SANDBOXES = 20
CREATE_STAGGER_S = 0.25
LIFETIME_MARGIN_S = 300
PROBE = (
    f"echo template-format=${{{TEMPLATE_FORMAT_VAR}:-none}}; "
    "opencode --version 2>/dev/null | tail -n 1; "
    "python3 -c 'import uvicorn' 2>/dev/null && echo proxy-deps-ok; true"
)


def create_error(error: BaseException, template: str) -> SandboxError:
    """One clear message for every way E2B sandbox creation fails."""
    if isinstance(error, AuthenticationException):
        return SandboxError("E2B rejected the API key: check E2B_API_KEY")
    if isinstance(error, RateLimitException):
        return SandboxError(
            f"E2B rate limit or concurrent-sandbox cap reached; lower {MAX_SANDBOXES_VAR} or retry later"
        )
    if isinstance(error, ServiceBusyException):
        return SandboxError("E2B is busy (HTTP 503); retry later")
    if isinstance(error, (NotFoundException, TemplateException)) or (
        isinstance(error, SandboxException) and error.status_code in (400, 404)
    ):
        return SandboxError(
            f"E2B template {template!r} was not found ({error}); build it once with "
            f"`opencode-env build-template --name {template}`, or pass template='base'"
        )
    if isinstance(error, SandboxException):
        return SandboxError(f"E2B could not create a sandbox (HTTP {error.status_code}): {error}")
    if isinstance(error, (httpx.TimeoutException, httpx.TransportError, OSError)):
        return SandboxError(f"the E2B API is unreachable: {type(error).__name__}: {error}")
    return SandboxError(f"E2B sandbox creation failed: {type(error).__name__}: {error}")


@contextlib.contextmanager
def _mapped(sandbox_id: str, action: str) -> Iterator[None]:
    """SDK and transport failures of an existing sandbox become one SandboxError (the rollout's sandbox_error)."""
    try:
        yield
    except (FileNotFoundException, CommandExitException):
        raise
    except (SandboxException, httpx.HTTPError) as error:
        raise SandboxError(f"E2B sandbox {sandbox_id}: {action} failed: {type(error).__name__}: {error}") from error


class E2BProcess:
    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._done: asyncio.Future[Any] = asyncio.ensure_future(self._wait())

    async def _wait(self) -> Any:
        try:
            return await self._handle.wait()
        except CommandExitException as exited:
            return exited

    async def running(self) -> bool:
        return not self._done.done()

    async def kill(self) -> None:
        if not self._done.done():
            with contextlib.suppress(SandboxException):
                await self._handle.kill()
        # Only our own 5 s wait is bounded here; a cancellation from outside propagates.
        with contextlib.suppress(SandboxException, TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._done), timeout=5)


class E2BSandbox:
    backend = "e2b"

    def __init__(
        self,
        sandbox: Any,
        tools: ProvidedTools,
        env: Mapping[str, str],
        release: Any,
        spec: SandboxSpec | None = None,
    ) -> None:
        self._spec = spec or SandboxSpec()
        self._sandbox = sandbox
        self.sandbox_id: str = sandbox.sandbox_id
        self.tools = tools
        self._env = dict(env)
        self._release = release
        self._processes: set[E2BProcess] = set()
        self.enforcement = {
            "isolation": "E2B microVM; task commands as user, the proxy as root",
            "verify": "as grader (a second user), fresh HOME and TMPDIR; OpenCode and its tools both as user",
        }
        self.opencode_data_dir = OPENCODE_DATA_DIR
        self.opencode_isolated = False
        self._closer = CloseOnce(self._close)

    @property
    def _grader_user(self) -> str:
        return "root" if self._spec.grader_is_root else GRADER_USER

    def _envs(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {**self._env, **(extra or {})}

    async def run(
        self,
        cmd: str,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKDIR,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        keep_background: bool = False,
        identity: Identity = "user",
    ) -> CommandResult:
        """Task commands run as `user` (the template gives it no sudo), install steps as root, verify as `grader`
        with a fresh HOME and TMPDIR; OpenCode (`agent`) runs as `user` too: E2B gives no second user namespace.
        A command's own process is killed when it ends; what it left in the background lives on in the VM until
        the sandbox closes, as E2B does (setup's services rely on it)."""
        if self._closer.started:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")
        started = time.monotonic()
        stdout, stderr = BoundedOutput(max_output_bytes), BoundedOutput(max_output_bytes)
        with _mapped(self.sandbox_id, "running a command"):
            handle = await self._sandbox.commands.run(
                cmd,
                background=True,
                envs={**self._envs(env), **(GRADER_ENV if identity == "grader" else {})},
                cwd=cwd,
                user={"root": "root", "grader": self._grader_user}.get(identity, TASK_USER),
                timeout=0,
                on_stdout=lambda text: stdout.feed(text.encode()),
                on_stderr=lambda text: stderr.feed(text.encode()),
            )
        process = E2BProcess(handle)
        self._processes.add(process)
        timed_out, exit_code = False, None
        try:
            finished = await asyncio.wait_for(asyncio.shield(process._done), timeout=max(timeout_s, 0.001))
            exit_code = finished.exit_code
        except TimeoutError:
            timed_out = True
        finally:
            await process.kill()
            self._processes.discard(process)
        return CommandResult(
            cmd=cmd,
            exit_code=exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            duration_s=round(time.monotonic() - started, 4),
            timed_out=timed_out,
            output_truncated=stdout.truncated or stderr.truncated,
        )

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> E2BProcess:
        if self._closer.started:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")
        logged = f"mkdir -p {shlex.quote(os.path.dirname(log_path))} && exec >> {shlex.quote(log_path)} 2>&1; {cmd}"
        with _mapped(self.sandbox_id, "starting a command"):
            handle = await self._sandbox.commands.run(
                logged, background=True, envs=self._envs(env), cwd=cwd, user=TASK_USER, timeout=0
            )
        process = E2BProcess(handle)
        self._processes.add(process)
        return process

    async def run_root(self, cmd: str, timeout_s: float) -> tuple[int | None, str]:
        result = await self.run(cmd, timeout_s=timeout_s, cwd="/", identity="root", max_output_bytes=64 * 2**20)
        return result.exit_code, result.stdout if result.exit_code == 0 else result.stderr

    async def write_root_file(self, path: str, data: str) -> None:
        with _mapped(self.sandbox_id, "writing a file"):
            await self._sandbox.files.write(path, data, user="root")

    async def start_root(self, cmd: str, env: dict[str, str]) -> E2BProcess:
        with _mapped(self.sandbox_id, "starting a root command"):
            handle = await self._sandbox.commands.run(
                cmd, background=True, envs={**self._env, **env}, cwd="/", user="root", timeout=0
            )
        process = E2BProcess(handle)
        self._processes.add(process)
        return process

    async def start_proxy(self, launch: ProxyLaunch) -> RootProxy:
        return await start_root_proxy(self, launch)

    async def write_control_file(self, name: str, data: str) -> str:
        """In the user's home: E2B's boundary is the VM, and a task that rewrites its own agent's config only
        loses its own capture."""
        path = f"{CONTROL_DIR}/{name}"
        with _mapped(self.sandbox_id, "writing a file"):
            await self._sandbox.files.write(path, data)
        return path

    async def read_tail(self, path: str, limit: int) -> bytes:
        return (await self.read_file(path))[-limit:]

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        """Root makes the work dir and the verifier directory the grader's (never following a link the agent left);
        the grader then writes each protected file itself, so no path the agent planted can make root write."""
        workdir = self._spec.workdir
        exit_code, output = await self.run_root(handoff_script(protected, workdir), 120)
        if exit_code != 0:
            raise SandboxError(f"could not hand the work dir to the grader in {self.sandbox_id}: {output[-500:]}")
        for path, text in protected.items():
            with _mapped(self.sandbox_id, "writing a protected file"):
                await self._sandbox.files.write(task_path(path, workdir), text, user=GRADER_USER)

    def limits_hit(self) -> list[LimitHit]:
        return []

    async def write_file(self, path: str, data: str | bytes) -> None:
        with _mapped(self.sandbox_id, "writing a file"):
            await self._sandbox.files.write(path, data)

    async def read_file(self, path: str) -> bytes:
        try:
            with _mapped(self.sandbox_id, "reading a file"):
                data = await self._sandbox.files.read(path, format="bytes")
        except FileNotFoundException as missing:
            raise FileNotFoundError(path) from missing
        return bytes(data)

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        try:
            with _mapped(self.sandbox_id, "listing files"):
                entries = await self._sandbox.files.list(root, depth=32)
        except FileNotFoundException:
            return []
        prefix = root.rstrip("/") + "/"
        files = sorted((entry for entry in entries if entry.type == FileType.FILE), key=lambda e: e.path)
        return [FileEntry(entry.path.removeprefix(prefix), entry.size) for entry in files[:limit]]

    async def close(self) -> None:
        await self._closer()

    async def _close(self) -> None:
        try:
            for process in list(self._processes):
                await process.kill()
            await self._sandbox.kill()
        except (SandboxException, httpx.HTTPError, OSError) as error:
            log.error("killing E2B sandbox %s failed: %s (opencode-env reap will find it)", self.sandbox_id, error)
        finally:
            self._release()


class E2BBackend:
    """Creates E2B sandboxes, at most `max_sandboxes` alive at once, creations staggered."""

    name = "e2b"

    def __init__(
        self,
        *,
        sandbox_class: Any = AsyncSandbox,
        api_key: str | None = None,
        max_sandboxes: int | None = None,
        server_id: str = "",
    ) -> None:
        self._sandbox_class = sandbox_class
        self._api_key = api_key
        limit = max_sandboxes or limit_from_env(MAX_SANDBOXES_VAR, DEFAULT_MAX_SANDBOXES)
        self._admission = Admission(limit, stagger_s=CREATE_STAGGER_S)
        self._server_id = server_id or f"{os.uname().nodename}-{os.getpid()}"
        self._open = OpenSandboxes()

    def _key(self) -> str:
        key = self._api_key or os.environ.get("E2B_API_KEY", "")
        if not key:
            raise SandboxError(
                "E2B_API_KEY is not set: the e2b backend needs an E2B API key (or use the local backend)"
            )
        return key

    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        key = self._key()
        template = spec.template or DEFAULT_TEMPLATE
        await self._admission.acquire()
        try:
            sandbox = await self._create_killing_if_cancelled(spec, template, key)
        except BaseException:
            self._admission.release()
            raise
        try:
            tools = await self._probe(sandbox, template)
        except BaseException as error:
            # A sandbox that exists bills until its lifetime ends: kill it whatever stopped the probe.
            await asyncio.shield(_kill_quietly(sandbox))
            self._admission.release()
            if isinstance(error, Exception) and not isinstance(error, SandboxError):
                raise SandboxError(f"the E2B sandbox did not answer its first command: {error}") from error
            raise
        opened: E2BSandbox

        def release() -> None:
            self._admission.release()
            self._open.discard(opened)

        opened = E2BSandbox(sandbox, tools, spec.env, release, spec=spec)
        self._open.add(opened)
        return opened

    async def close_all(self) -> int:
        return await self._open.close_all()

    async def _create_killing_if_cancelled(self, spec: SandboxSpec, template: str, key: str) -> Any:
        creating = asyncio.ensure_future(
            self._sandbox_class.create(
                template=template,
                timeout=int(spec.lifetime_s) + LIFETIME_MARGIN_S,
                api_key=key,
                metadata={
                    TAG: "1",
                    "server": self._server_id,
                    "task_id": spec.task_id[:100],
                    "created": str(int(time.time())),
                },
                envs=dict(spec.env),
            )
        )
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            creating.add_done_callback(_kill_when_created)
            raise
        except Exception as error:
            raise create_error(error, template) from error

    async def _probe(self, sandbox: Any, template: str) -> ProvidedTools:
        """What the template already has: OpenCode (its version) and the proxy's Python packages. A template with
        OpenCode built by another opencode-env (its format differs) is refused: it would run the proxy wrongly."""
        try:
            result = await sandbox.commands.run(PROBE, timeout=60)
        except CommandExitException as exited:
            result = exited
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        version = next((line for line in lines if line[:1].isdigit()), None)
        built = next((line.split("=", 1)[1] for line in lines if line.startswith("template-format=")), "none")
        if version and built != TEMPLATE_FORMAT:
            raise SandboxError(
                f"E2B template {template!r} was built by another opencode-env (template format {built}, this version "
                f"needs {TEMPLATE_FORMAT}): rebuild the template with `opencode-env build-template --name {template}`"
            )
        return ProvidedTools(
            opencode="opencode" if version else None,
            opencode_version=version,
            python="python3",
            proxy_ready="proxy-deps-ok" in lines,
        )


_late_kills: set[asyncio.Future[Any]] = set()


async def _kill_quietly(sandbox: Any) -> None:
    try:
        await sandbox.kill()
    except (SandboxException, httpx.HTTPError, OSError) as error:
        log.error("killing E2B sandbox %s failed: %s (opencode-env reap will find it)", sandbox.sandbox_id, error)


def _kill_when_created(creating: asyncio.Future[Any]) -> None:
    if creating.cancelled() or creating.exception() is not None:
        return
    sandbox = creating.result()
    log.warning("creation of %s finished after its rollout was cancelled: killing it", sandbox.sandbox_id)
    kill = asyncio.ensure_future(sandbox.kill())
    _late_kills.add(kill)
    kill.add_done_callback(_late_kills.discard)


async def reap(*, older_than_s: float, sandbox_class: Any = AsyncSandbox, api_key: str | None = None) -> list[str]:
    """Kill sandboxes tagged by this tool that have lived longer than `older_than_s`; returns their ids."""
    key = api_key or os.environ.get("E2B_API_KEY", "")
    if not key:
        raise SandboxError("E2B_API_KEY is not set: reap needs the key the sandboxes were created with")
    from e2b.sandbox.sandbox_api import SandboxQuery

    paginator = sandbox_class.list(query=SandboxQuery(metadata={TAG: "1"}), api_key=key)
    now = time.time()
    killed = []
    while paginator.has_next:
        for info in await paginator.next_items():
            if now - info.started_at.timestamp() >= older_than_s:
                await sandbox_class.kill(info.sandbox_id, api_key=key)
                killed.append(info.sandbox_id)
    return killed
