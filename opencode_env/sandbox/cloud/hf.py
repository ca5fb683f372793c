"""The Hugging Face Sandboxes backend: the sandbox contract on `huggingface_hub.Sandbox` (one HF Job per sandbox).
The only module that imports the SDK's sandbox API.

SDK behaviour mapped here, at the edge:
- The SDK is synchronous: every call runs in this backend's own threads (never the loop's default executor, which
  a long agent command would exhaust) under our own deadline, and its exceptions become one `SandboxError` that
  says what to do.
- Its sandbox server runs every command as root (PID 1, holding the sandbox token): task commands drop to `user`
  through setpriv (`hf_shell`), privileged steps stay root.
- Dedicated sandboxes only: a pool roots "/" at a private home, which breaks the /home/user paths tasks rely on.
- A watchdog and the SDK's idle timeout bound an abandoned sandbox; `reap` finds the rest by label. The lifecycle
  around the SDK (admission, labels, a late creation killed once it exists, closing) is the one every cloud backend
  shares (`lifecycle`, `sandbox`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from huggingface_hub import Sandbox, get_token

from opencode_env.sandbox.base import (
    Capabilities,
    FileEntry,
    Identity,
    Preflight,
    ProvidedTools,
    SandboxError,
    SandboxSpec,
    per_cpu_concurrency,
)
from opencode_env.sandbox.cloud import hf_shell
from opencode_env.sandbox.cloud.admission import DEFAULT_LIMIT
from opencode_env.sandbox.cloud.hf_sdk import CALL_TIMEOUT_S, TAG, Calls, reap, sdk_error
from opencode_env.sandbox.cloud.lifecycle import LIFETIME_MARGIN_S, Lifecycle, Tags, provided_tools
from opencode_env.sandbox.cloud.sandbox import Capture, CloudSandbox
from opencode_env.settings import variable
from opencode_env.wire import CommandResult

log = logging.getLogger("opencode_env.hf")
FALLBACK_IMAGE = "python:3.12"
DEFAULT_FLAVOR = "cpu-basic"
START_TIMEOUT_S = 180.0
CALL_GRACE_S = 30.0
KILL_TIMEOUT_S = 30.0
PREPARE_TIMEOUT_S = 120.0
INSTALL_TIMEOUT_S = 600.0
TRANSIENT_POLL_FAILURES = 3
ENFORCEMENT = {
    "isolation": "Hugging Face Job (a dedicated VM); task commands as user (setpriv, no capabilities, "
    "no new privileges), the capture proxy as root",
    "verify": "as grader (a second user), fresh HOME and TMPDIR",
    "agent": "OpenCode as its own uid, its tools as user through a root broker; proxy checks the caller's uid",
    "network": "the Job's own: the internet, unfiltered",
    "limits": "the Job's hardware flavor, not the per-rollout limits",
}
__all__ = ["HFBackend", "HFProcess", "HFSandbox", "default_image", "reap"]


def default_image(configured: str = "", space_id: str = "") -> str:
    """`configured` (the operator's OPENCODE_ENV_HF_IMAGE), else the image of the Space `space_id` names (SPACE_ID,
    set by a Space: its image has OpenCode and the proxy's packages), else a plain Python image on which OpenCode is
    installed at run time."""
    if configured:
        return configured
    if space_id:
        return f"hf.co/spaces/{space_id}"
    return FALLBACK_IMAGE


def label_value(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63] or "-"


class HFProcess:
    def __init__(self, sandbox: HFSandbox, handle: Any) -> None:
        self._sandbox = sandbox
        self._handle = handle
        self._exited = False
        self._failed_polls = 0

    async def running(self) -> bool:
        if self._exited:
            return False
        try:
            listing = await self._sandbox.calls(self._sandbox.sdk.processes, timeout_s=CALL_TIMEOUT_S, action="poll")
        except SandboxError:
            if self._sandbox.closed:
                self._exited = True
                return False
            self._failed_polls += 1
            if self._failed_polls >= TRANSIENT_POLL_FAILURES:
                raise
            return True
        self._failed_polls = 0
        mine = next((process for process in listing if process.id == self._handle.id), None)
        # A process the server no longer lists has gone with its sandbox: it did not exit cleanly.
        self._exited = mine is None or not mine.running
        return not self._exited

    async def kill(self) -> None:
        if self._exited:
            return
        with contextlib.suppress(SandboxError):
            await self._sandbox.calls(self._handle.kill, timeout_s=CALL_TIMEOUT_S, action="kill a process")
        for _ in range(50):
            if not await self.running():
                return
            await asyncio.sleep(0.1)
        log.warning("process %s in %s still runs after kill", self._handle.id, self._sandbox.sandbox_id)


class HFSandbox(CloudSandbox):
    backend = "hf"

    def __init__(
        self,
        sdk: Any,
        tools: ProvidedTools,
        *,
        env: Mapping[str, str],
        calls: Calls,
        tools_dir: str,
        release: Callable[[], None],
        spec: SandboxSpec | None = None,
    ) -> None:
        super().__init__(sdk.id, tools, spec, release)
        self.sdk = sdk
        self.calls = calls
        self._env = {**env, "OPENCODE_ENV_TOOLS_BIN": f"{tools_dir}/bin"}
        self._control_dir = f"{tools_dir}/control"
        self.enforcement = dict(ENFORCEMENT)

    async def _run_as(
        self, identity: Identity, cmd: str, *, timeout_s: float, env: Mapping[str, str] | None, cwd: str, limit: int
    ) -> CommandResult:
        """Task commands run as `user` (setpriv, no capabilities, no new privileges), install steps as root, verify
        as `grader`. A timeout kills the command's process group."""
        argv = hf_shell.as_identity(identity, cmd, grader_is_root=self._spec.grader_is_root)
        return await self._run(cmd, argv, timeout_s=timeout_s, env=env, cwd=cwd, limit=limit)

    async def _run(
        self,
        cmd: str,
        argv: list[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None,
        cwd: str,
        limit: int,
        stdin: str | None = None,
    ) -> CommandResult:
        capture = Capture(cmd, limit)
        call = functools.partial(
            self.sdk.run,
            argv,
            shell=False,
            env={**self._env, **(env or {})},
            cwd=cwd,
            timeout=max(timeout_s, 0.001),
            stdin=stdin,
            on_stdout=capture.on_stdout,
            on_stderr=capture.on_stderr,
            check=False,
            capture_output=False,
        )
        try:
            result = await self.calls(call, timeout_s=timeout_s + CALL_GRACE_S, action="run a command")
        except SandboxError:
            if not self.closed:
                raise
            capture.note("\n[the sandbox was closed while the command ran]")
            return capture.result(None, timed_out=False)
        timed_out = bool(result.timed_out)
        return capture.result(None if timed_out else result.exit_code, timed_out=timed_out)

    async def _start_as(self, identity: Identity, cmd: str, *, env: Mapping[str, str] | None, cwd: str) -> HFProcess:
        argv = hf_shell.as_identity(identity, cmd)
        call = functools.partial(
            self.sdk.run, argv, shell=False, env={**self._env, **(env or {})}, cwd=cwd, background=True
        )
        handle = await self.calls(call, timeout_s=CALL_TIMEOUT_S, action="start a process")
        return HFProcess(self, handle)

    async def _file_command(
        self, script: str, action: str, stdin: str | None = None, *, identity: Identity = "user"
    ) -> CommandResult:
        self._check_open()
        argv = hf_shell.as_identity(identity, script)
        result = await self._run(script, argv, timeout_s=CALL_TIMEOUT_S, env=None, cwd="/", limit=2**31, stdin=stdin)
        if result.exit_code not in (0, hf_shell.MISSING_EXIT, hf_shell.TOO_BIG_EXIT):
            raise SandboxError(f"could not {action} in sandbox {self.sandbox_id}: {result.stderr.strip()[-500:]}")
        return result

    async def _write_as(self, identity: Identity, path: str, data: str | bytes) -> None:
        payload = base64.b64encode(data.encode() if isinstance(data, str) else data).decode()
        await self._file_command(hf_shell.write_file(path), f"write {path}", stdin=payload, identity=identity)

    async def read_file(self, path: str) -> bytes:
        result = await self._file_command(hf_shell.read_file(path), f"read {path}", identity=self._owner_of(path))
        if result.exit_code == hf_shell.MISSING_EXIT:
            raise FileNotFoundError(path)
        if result.exit_code == hf_shell.TOO_BIG_EXIT:
            raise SandboxError(f"{path} is larger than {hf_shell.MAX_READ_BYTES} bytes")
        return base64.b64decode(result.stdout)

    async def read_tail(self, path: str, limit: int) -> bytes:
        result = await self._file_command(
            hf_shell.read_tail(path, limit), f"read {path}", identity=self._owner_of(path)
        )
        if result.exit_code == hf_shell.MISSING_EXIT:
            raise FileNotFoundError(path)
        return base64.b64decode(result.stdout)

    async def write_control_file(self, name: str, data: str) -> str:
        """Root-owned (0644 in a root-owned directory): the agent reads its config and instruction, never edits
        them."""
        path = f"{self._control_dir}/{name}"
        payload = base64.b64encode(data.encode()).decode()
        await self._file_command(hf_shell.write_control_file(path), f"write {path}", stdin=payload, identity="root")
        return path

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        result = await self._file_command(
            hf_shell.list_files(root, limit), f"list {root}", identity=self._owner_of(root)
        )
        return hf_shell.parse_listing(result.stdout)

    async def _kill_vm(self) -> None:
        await _kill(self.calls, self.sdk)


class HFBackend:
    """Creates dedicated HF sandboxes, at most `max_sandboxes` alive at once, creations staggered (`Lifecycle`);
    the `Provider` of its lifecycle. It reads no environment of its own: the registry passes the operator's settings
    (`make_backend`); without a `token` it uses the SDK's (`huggingface_hub.get_token`: HF_TOKEN or a login). An
    empty `namespace` is the token's own."""

    name = "hf"
    capabilities = Capabilities(
        enforces_limits=False,
        proxy_beside_task_root=True,
        default_concurrency=per_cpu_concurrency(),
        risk="starts sandboxes billed to the server owner's Hugging Face account",
        grader_box_at_agent_end=True,
    )
    label = "HF"
    cap_setting = variable("hf_max_sandboxes")
    tags = Tags(TAG, server=f"{TAG}-server", task=f"{TAG}-task", created=f"{TAG}-created", clean=label_value)
    start_timeout_s: float | None = START_TIMEOUT_S

    def __init__(
        self,
        *,
        sandbox_class: Any = Sandbox,
        token: str = "",
        image: str = FALLBACK_IMAGE,
        flavor: str = DEFAULT_FLAVOR,
        namespace: str = "",
        max_sandboxes: int = DEFAULT_LIMIT,
        tools_dir: str = hf_shell.DEFAULT_TOOLS_DIR,
        server_id: str = "",
    ) -> None:
        self._sandbox_class = sandbox_class
        self._token_override = token
        self._image = image
        self._flavor = flavor
        self._namespace = namespace or None
        self._lifecycle = Lifecycle(self, limit=max_sandboxes, server_id=server_id)
        self._calls = Calls(threads=4 * max_sandboxes + 8)
        self._tools_dir = tools_dir

    async def create(self, spec: SandboxSpec) -> HFSandbox:
        if spec.network != "internet":
            raise SandboxError(
                f"the hf backend cannot limit a sandbox's network (network={spec.network!r}): its Job reaches the "
                "internet; use network='internet', or the local backend for model_only"
            )
        return await self._lifecycle.create(spec, spec.template or self._image)

    async def close_all(self) -> int:
        return await self._lifecycle.close_all()

    async def preflight(self) -> Preflight:
        return self.preflight_verdict()

    def preflight_verdict(self) -> Preflight:
        """Whether it has a token: its own, or the SDK's (HF_TOKEN, `hf auth login`); a token without Jobs access
        shows at the first sandbox."""
        if self._token_override or get_token():
            return Preflight()
        return Preflight("the hf backend needs a Hugging Face token with Jobs access: set HF_TOKEN")

    def credential(self) -> str:
        token = self._token_override or get_token()
        if not token:
            raise SandboxError("HF_TOKEN is not set: the hf backend creates sandboxes with a Hugging Face token")
        return token

    async def create_vm(self, image: str, spec: SandboxSpec, tags: Mapping[str, str], credential: str) -> Any:
        create = functools.partial(
            self._sandbox_class.create,
            image=image,
            flavor=self._flavor,
            idle_timeout=int(spec.lifetime_s) + LIFETIME_MARGIN_S,
            namespace=self._namespace,
            labels=dict(tags),
            start_timeout=START_TIMEOUT_S,
            token=credential,
        )
        return await asyncio.wrap_future(self._calls.submit(create))

    def create_error(self, error: Exception, image: str) -> SandboxError:
        return sdk_error(error, "create a sandbox", image)

    def vm_id(self, vm: Any) -> str:
        return str(vm.id)

    async def kill_vm(self, vm: Any) -> None:
        await _kill(self._calls, vm)

    async def prepare(self, vm: Any, spec: SandboxSpec, image: str) -> ProvidedTools:
        """Make `user` and its home, find what the image has, install OpenCode when it lacks it, start the watchdog."""
        probe = HFSandbox(vm, ProvidedTools(), env={}, calls=self._calls, tools_dir=self._tools_dir, release=_no_slot)
        prepared = await probe.run(hf_shell.prepare_image(), timeout_s=PREPARE_TIMEOUT_S, cwd="/", identity="root")
        if prepared.exit_code != 0:
            raise SandboxError(f"preparing HF sandbox {vm.id} failed: {prepared.stderr.strip()[-800:]}")
        await probe.start_root(hf_shell.watchdog(spec.lifetime_s + LIFETIME_MARGIN_S), {})
        version, proxy_ready = await _probe(probe)
        for missing, script in (
            (version is None, hf_shell.install_opencode(self._tools_dir)),
            (not proxy_ready, hf_shell.install_proxy_packages()),
        ):
            if not missing:
                continue
            installed = await probe.run(script, timeout_s=INSTALL_TIMEOUT_S, cwd="/", identity="root")
            if installed.exit_code != 0:
                raise SandboxError(f"installing in HF sandbox {vm.id} failed: {installed.stderr.strip()[-800:]}")
        if version is None or not proxy_ready:
            version, proxy_ready = await _probe(probe)
        return provided_tools(version, proxy_ready)

    def open_sandbox(self, vm: Any, tools: ProvidedTools, spec: SandboxSpec, release: Callable[[], None]) -> HFSandbox:
        return HFSandbox(
            vm, tools, env=spec.env, calls=self._calls, tools_dir=self._tools_dir, release=release, spec=spec
        )


async def _probe(probe: HFSandbox) -> tuple[str | None, bool]:
    """What the image has: OpenCode as `user` runs it, the proxy's packages as root imports them."""
    opencode = await probe.run(hf_shell.OPENCODE_PROBE, timeout_s=CALL_TIMEOUT_S, cwd="/")
    proxy = await probe.run(hf_shell.PROXY_PROBE, timeout_s=CALL_TIMEOUT_S, cwd="/", identity="root")
    return hf_shell.parse_probe(opencode.stdout + proxy.stdout)


def _no_slot() -> None:
    """The probe's release: it holds no slot, and its VM is the lifecycle's to kill."""


async def _kill(calls: Calls, sdk: Any) -> None:
    await calls(sdk.kill, timeout_s=KILL_TIMEOUT_S, action="kill the sandbox")
