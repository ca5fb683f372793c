"""The E2B backend: the same sandbox contract on E2B's `AsyncSandbox`. The only module that imports `e2b`.

SDK behaviour mapped here, at the edge: a non-zero exit (`CommandExitException`) is a result, never an error;
the SDK's 60 s default command timeout (which also kills background processes) is never inherited; every failure
of `create()` becomes one `SandboxError` that says what to do. The lifecycle around the SDK (admission, tags, a
cancelled creation killed once it exists, closing) is the one every cloud backend shares (`lifecycle`, `sandbox`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
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
    Capabilities,
    FileEntry,
    Identity,
    Preflight,
    ProvidedTools,
    SandboxError,
    SandboxSpec,
)
from opencode_env.sandbox.cloud.admission import DEFAULT_LIMIT
from opencode_env.sandbox.cloud.grader import GRADER_ENV, GRADER_USER
from opencode_env.sandbox.cloud.lifecycle import (
    LIFETIME_MARGIN_S,
    OPENCODE_VERSION_PROBE,
    Lifecycle,
    Tags,
    provided_tools,
)
from opencode_env.sandbox.cloud.sandbox import Capture, CloudSandbox
from opencode_env.settings import variable
from opencode_env.wire import TEMPLATE_FORMAT, TEMPLATE_FORMAT_ENV_NAME, CommandResult

DEFAULT_TEMPLATE = "opencode-env"
E2B_CONCURRENCY = 16
"""Below OPENCODE_ENV_E2B_MAX_SANDBOXES's default of 20 (E2B's free-tier cap)."""
TASK_USER = "user"
FILE_USERS = {"root": "root", "grader": GRADER_USER}
"""Who writes a file, by identity; the SDK's default user (the template's: `user`) otherwise."""
TAG = "opencode_env"
PROBE = (
    f"echo template-format=${{{TEMPLATE_FORMAT_ENV_NAME}:-none}}; "
    f"{OPENCODE_VERSION_PROBE}; "
    "python3 -c 'import uvicorn' 2>/dev/null && echo proxy-deps-ok; true"
)


def create_error(error: BaseException, template: str) -> SandboxError:
    """One clear message for every way E2B sandbox creation fails."""
    if isinstance(error, AuthenticationException):
        return SandboxError("E2B rejected the API key: check E2B_API_KEY")
    if isinstance(error, RateLimitException):
        return SandboxError(
            f"E2B rate limit or concurrent-sandbox cap reached; lower {variable('e2b_max_sandboxes')} or retry later"
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


class E2BSandbox(CloudSandbox):
    backend = "e2b"

    def __init__(
        self,
        sandbox: Any,
        tools: ProvidedTools,
        env: Mapping[str, str],
        release: Callable[[], None],
        spec: SandboxSpec | None = None,
    ) -> None:
        super().__init__(sandbox.sandbox_id, tools, spec, release)
        self._sandbox = sandbox
        self._env = dict(env)
        self._processes: set[E2BProcess] = set()
        self.enforcement = {
            "isolation": "E2B microVM; task commands as user, the proxy as root",
            "verify": "as grader (a second user), fresh HOME and TMPDIR",
            "agent": "OpenCode as its own uid, its tools as user through a root broker; proxy checks the caller's uid",
        }

    def _user(self, identity: Identity) -> str:
        grader = "root" if self._spec.grader_is_root else GRADER_USER
        return {"root": "root", "grader": grader}.get(identity, TASK_USER)

    async def _run_as(
        self, identity: Identity, cmd: str, *, timeout_s: float, env: Mapping[str, str] | None, cwd: str, limit: int
    ) -> CommandResult:
        """Task commands run as `user` (the template gives it no sudo), install steps as root, verify as `grader`
        with a fresh HOME and TMPDIR; OpenCode's command comes here as root's, which drops to OpenCode's own uid
        (CloudSandbox.run). A command's own process is killed when it ends."""
        capture = Capture(cmd, limit)
        envs = {**self._env, **(env or {}), **(GRADER_ENV if identity == "grader" else {})}
        process = await self._launch(cmd, envs, cwd, self._user(identity), capture)
        timed_out, exit_code = False, None
        try:
            finished = await asyncio.wait_for(asyncio.shield(process._done), timeout=max(timeout_s, 0.001))
            exit_code = finished.exit_code
        except TimeoutError:
            timed_out = True
        finally:
            await process.kill()
            self._processes.discard(process)
        return capture.result(exit_code, timed_out=timed_out)

    async def _start_as(self, identity: Identity, cmd: str, *, env: Mapping[str, str] | None, cwd: str) -> E2BProcess:
        return await self._launch(cmd, {**self._env, **(env or {})}, cwd, self._user(identity))

    async def _launch(
        self, cmd: str, envs: dict[str, str], cwd: str, user: str, capture: Capture | None = None
    ) -> E2BProcess:
        # The SDK's default timeout (60 s) would also end a background command: timeout=0 means none.
        with _mapped(self.sandbox_id, "running a command" if capture else "starting a command"):
            handle = await self._sandbox.commands.run(
                cmd,
                background=True,
                envs=envs,
                cwd=cwd,
                user=user,
                timeout=0,
                on_stdout=capture.on_stdout if capture else None,
                on_stderr=capture.on_stderr if capture else None,
            )
        process = E2BProcess(handle)
        self._processes.add(process)
        return process

    async def _write_as(self, identity: Identity, path: str, data: str | bytes) -> None:
        with _mapped(self.sandbox_id, "writing a file"):
            await self._sandbox.files.write(path, data, user=FILE_USERS.get(identity))

    async def write_control_file(self, name: str, data: str) -> str:
        """Root's, readable by all, in OpenCode's root: no task identity can change the config or the instruction."""
        root = await self.made_agent_root()
        path = f"{root.control}/{name}"
        await self._write_as("root", path, data)
        exit_code, output = await self.run_root(f"chmod 644 {shlex.quote(path)}", 30)
        if exit_code != 0:
            raise SandboxError(f"could not write {path} in {self.sandbox_id}: {output[-500:]}")
        return path

    async def read_tail(self, path: str, limit: int) -> bytes:
        return (await self.read_file(path))[-limit:]

    async def read_file(self, path: str) -> bytes:
        try:
            with _mapped(self.sandbox_id, "reading a file"):
                data = await self._sandbox.files.read(path, format="bytes", user=self._owner_of(path))
        except FileNotFoundException as missing:
            raise FileNotFoundError(path) from missing
        return bytes(data)

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        try:
            with _mapped(self.sandbox_id, "listing files"):
                entries = await self._sandbox.files.list(root, depth=32, user=self._owner_of(root))
        except FileNotFoundException:
            return []
        prefix = root.rstrip("/") + "/"
        files = sorted((entry for entry in entries if entry.type == FileType.FILE), key=lambda e: e.path)
        return [FileEntry(entry.path.removeprefix(prefix), entry.size) for entry in files[:limit]]

    async def _kill_vm(self) -> None:
        try:
            with _mapped(self.sandbox_id, "stopping a command"):
                for process in list(self._processes):
                    await process.kill()
        finally:
            await _kill(self._sandbox)


class E2BBackend:
    """Creates E2B sandboxes with `api_key`, at most `max_sandboxes` alive at once, creations staggered
    (`Lifecycle`); the `Provider` of its lifecycle. It reads no environment: the registry passes the operator's
    E2B_API_KEY and OPENCODE_ENV_E2B_MAX_SANDBOXES (`make_backend`)."""

    name = "e2b"
    capabilities = Capabilities(
        enforces_limits=False,
        proxy_beside_task_root=True,
        default_concurrency=E2B_CONCURRENCY,
        risk="starts sandboxes billed to the server owner's E2B account",
        grader_box_at_agent_end=True,
    )
    label = "E2B"
    cap_setting = variable("e2b_max_sandboxes")
    tags = Tags(TAG, server="server", task="task_id", created="created", clean=lambda text: text[:100])
    start_timeout_s: float | None = None

    def __init__(
        self,
        *,
        sandbox_class: Any = AsyncSandbox,
        api_key: str = "",
        max_sandboxes: int = DEFAULT_LIMIT,
        server_id: str = "",
    ) -> None:
        self._sandbox_class = sandbox_class
        self._api_key = api_key
        self._lifecycle = Lifecycle(self, limit=max_sandboxes, server_id=server_id)

    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        return await self._lifecycle.create(spec, spec.template or DEFAULT_TEMPLATE)

    async def close_all(self) -> int:
        return await self._lifecycle.close_all()

    async def preflight(self) -> Preflight:
        return self.preflight_verdict()

    def preflight_verdict(self) -> Preflight:
        """Whether it has a key (a wrong one shows at the first sandbox)."""
        return Preflight(None if self._api_key else "the e2b backend needs an E2B API key: set E2B_API_KEY")

    def credential(self) -> str:
        if not self._api_key:
            raise SandboxError(
                "E2B_API_KEY is not set: the e2b backend needs an E2B API key (or use the local backend)"
            )
        return self._api_key

    async def create_vm(self, image: str, spec: SandboxSpec, tags: Mapping[str, str], credential: str) -> Any:
        return await self._sandbox_class.create(
            template=image,
            timeout=int(spec.lifetime_s) + LIFETIME_MARGIN_S,
            api_key=credential,
            metadata=dict(tags),
            envs=dict(spec.env),
        )

    def create_error(self, error: Exception, image: str) -> SandboxError:
        return create_error(error, image)

    def vm_id(self, vm: Any) -> str:
        return str(vm.sandbox_id)

    async def kill_vm(self, vm: Any) -> None:
        await _kill(vm)

    async def prepare(self, vm: Any, spec: SandboxSpec, image: str) -> ProvidedTools:
        """What the template already has: OpenCode (its version) and the proxy's Python packages. A template with
        OpenCode built by another opencode-env (its format differs) is refused: it would run the proxy wrongly."""
        try:
            result = await vm.commands.run(PROBE, timeout=60)
        except CommandExitException as exited:
            result = exited
        except Exception as error:
            raise SandboxError(f"the E2B sandbox did not answer its first command: {error}") from error
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        version = next((line for line in lines if line[:1].isdigit()), None)
        built = next((line.split("=", 1)[1] for line in lines if line.startswith("template-format=")), "none")
        if version and built != TEMPLATE_FORMAT:
            raise SandboxError(
                f"E2B template {image!r} was built by another opencode-env (template format {built}, this version "
                f"needs {TEMPLATE_FORMAT}): rebuild the template with `opencode-env build-template --name {image}`"
            )
        return provided_tools(version, "proxy-deps-ok" in lines)

    def open_sandbox(self, vm: Any, tools: ProvidedTools, spec: SandboxSpec, release: Callable[[], None]) -> E2BSandbox:
        return E2BSandbox(vm, tools, spec.env, release, spec=spec)


async def _kill(sandbox: Any) -> None:
    try:
        await sandbox.kill()
    except (SandboxException, httpx.HTTPError, OSError) as error:
        raise SandboxError(f"{type(error).__name__}: {error}") from error


async def reap(*, older_than_s: float, api_key: str, sandbox_class: Any = AsyncSandbox) -> list[str]:
    """Kill sandboxes tagged by this tool that have lived longer than `older_than_s`; returns their ids."""
    if not api_key:
        raise SandboxError("E2B_API_KEY is not set: reap needs the key the sandboxes were created with")
    from e2b.sandbox.sandbox_api import SandboxQuery

    paginator = sandbox_class.list(query=SandboxQuery(metadata={TAG: "1"}), api_key=api_key)
    now = time.time()
    killed = []
    while paginator.has_next:
        for info in await paginator.next_items():
            if now - info.started_at.timestamp() >= older_than_s:
                await sandbox_class.kill(info.sandbox_id, api_key=api_key)
                killed.append(info.sandbox_id)
    return killed
