"""The Hugging Face Sandboxes backend: the sandbox contract on `huggingface_hub.Sandbox` (one HF Job per sandbox).
The only module that imports the SDK's sandbox API.

SDK behaviour mapped here, at the edge:
- The SDK is synchronous: every call runs in this backend's own threads (never the loop's default executor, which
  a long agent command would exhaust) under our own deadline, and its exceptions become one `SandboxError` that
  says what to do.
- Its sandbox server runs every command as root (PID 1, holding the sandbox token): task commands drop to `user`
  through setpriv (`hf_shell`), privileged steps stay root.
- Dedicated sandboxes only: a pool roots "/" at a private home, which breaks the /home/user paths tasks rely on.
- A sandbox whose creation is cancelled, or outlives our deadline, is killed as soon as it exists; a watchdog and
  the SDK's idle timeout bound an abandoned one; `reap` finds the rest by label.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import re
import shlex
import time
from collections.abc import Mapping
from typing import Any

from huggingface_hub import Sandbox, get_token

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
from opencode_env.sandbox.cloud import hf_shell
from opencode_env.sandbox.cloud.admission import Admission, limit_from_env
from opencode_env.sandbox.cloud.grader import handoff_script
from opencode_env.sandbox.cloud.hf_sdk import (
    CALL_TIMEOUT_S,
    MAX_SANDBOXES_VAR,
    NAMESPACE_VAR,
    TAG,
    Calls,
    reap,
    sdk_error,
)
from opencode_env.sandbox.cloud.root_proxy import RootProxy, start_root_proxy
from opencode_env.sandbox.output import BoundedOutput
from opencode_env.wire.models import CommandResult, LimitHit

log = logging.getLogger("opencode_env.hf")
IMAGE_VAR = "OPENCODE_ENV_HF_IMAGE"
FLAVOR_VAR = "OPENCODE_ENV_HF_FLAVOR"
FALLBACK_IMAGE = "python:3.12"
DEFAULT_MAX_SANDBOXES = 20
CREATE_STAGGER_S = 0.25
START_TIMEOUT_S = 180.0
LIFETIME_MARGIN_S = 300
CALL_GRACE_S = 30.0
KILL_TIMEOUT_S = 30.0
PREPARE_TIMEOUT_S = 120.0
INSTALL_TIMEOUT_S = 600.0
TRANSIENT_POLL_FAILURES = 3
ENFORCEMENT = {
    "isolation": "Hugging Face Job (a dedicated VM); task commands as user (setpriv, no capabilities, "
    "no new privileges), the capture proxy as root",
    "verify": "as grader (a second user), fresh HOME and TMPDIR; OpenCode and its tools both as user",
    "network": "the Job's own: the internet, unfiltered",
    "limits": "the Job's hardware flavor, not the per-rollout limits",
}
__all__ = ["HFBackend", "HFProcess", "HFSandbox", "default_image", "reap"]


def default_image() -> str:
    """OPENCODE_ENV_HF_IMAGE, else this Space's own image (it has OpenCode and the proxy's packages), else a plain
    Python image on which OpenCode is installed at run time."""
    if configured := os.environ.get(IMAGE_VAR):
        return configured
    if space := os.environ.get("SPACE_ID"):
        return f"hf.co/spaces/{space}"
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


class HFSandbox:
    backend = "hf"

    def __init__(
        self,
        sdk: Any,
        tools: ProvidedTools,
        *,
        env: Mapping[str, str],
        calls: Calls,
        tools_dir: str,
        release: Any,
        spec: SandboxSpec | None = None,
    ) -> None:
        self._spec = spec or SandboxSpec()
        self.sdk = sdk
        self.sandbox_id: str = sdk.id
        self.tools = tools
        self.calls = calls
        self._env = {**env, "OPENCODE_ENV_TOOLS_BIN": f"{tools_dir}/bin"}
        self._control_dir = f"{tools_dir}/control"
        self._release = release
        self._closer = CloseOnce(self._close)
        self.enforcement = dict(ENFORCEMENT)
        self.opencode_data_dir = OPENCODE_DATA_DIR
        self.opencode_isolated = False

    @property
    def closed(self) -> bool:
        return self._closer.started

    def _check_open(self) -> None:
        if self._closer.started:
            raise SandboxError(f"sandbox {self.sandbox_id} is closed")

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
        """Task commands run as `user` (setpriv, no capabilities, no new privileges), install steps as root, verify
        as `grader`. A
        timeout kills the command's process group; what it left in the background otherwise lives on in the VM
        until the sandbox closes (as on E2B), so `keep_background` changes nothing here."""
        argv = hf_shell.as_identity(identity, cmd, grader_is_root=self._spec.grader_is_root)
        return await self._run(cmd, argv, timeout_s=timeout_s, env=env, cwd=cwd, max_output_bytes=max_output_bytes)

    async def _run(
        self,
        cmd: str,
        argv: list[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None,
        cwd: str,
        max_output_bytes: int,
        stdin: str | None = None,
    ) -> CommandResult:
        self._check_open()
        started = time.monotonic()
        stdout, stderr = BoundedOutput(max_output_bytes), BoundedOutput(max_output_bytes)
        call = functools.partial(
            self.sdk.run,
            argv,
            shell=False,
            env={**self._env, **(env or {})},
            cwd=cwd,
            timeout=max(timeout_s, 0.001),
            stdin=stdin,
            on_stdout=lambda text: stdout.feed(text.encode()),
            on_stderr=lambda text: stderr.feed(text.encode()),
            check=False,
            capture_output=False,
        )
        try:
            result = await self.calls(call, timeout_s=timeout_s + CALL_GRACE_S, action="run a command")
        except SandboxError:
            if not self._closer.started:
                raise
            stderr.feed(b"\n[the sandbox was closed while the command ran]")
            exit_code, timed_out = None, False
        else:
            timed_out = bool(result.timed_out)
            exit_code = None if timed_out else result.exit_code
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
    ) -> HFProcess:
        directory = shlex.quote(os.path.dirname(log_path))
        logged = f"mkdir -p {directory} && exec >> {shlex.quote(log_path)} 2>&1; {cmd}"
        return await self._start(logged, env=env, cwd=cwd, identity="user")

    async def _start(self, cmd: str, *, env: Mapping[str, str] | None, cwd: str, identity: Identity) -> HFProcess:
        self._check_open()
        argv = hf_shell.as_identity(identity, cmd)
        call = functools.partial(
            self.sdk.run, argv, shell=False, env={**self._env, **(env or {})}, cwd=cwd, background=True
        )
        handle = await self.calls(call, timeout_s=CALL_TIMEOUT_S, action="start a process")
        return HFProcess(self, handle)

    async def _file_command(
        self, script: str, action: str, stdin: str | None = None, *, identity: Identity = "user"
    ) -> CommandResult:
        result = await self._run(
            script,
            hf_shell.as_identity(identity, script),
            timeout_s=CALL_TIMEOUT_S,
            env=None,
            cwd="/",
            max_output_bytes=2**31,
            stdin=stdin,
        )
        if result.exit_code not in (0, hf_shell.MISSING_EXIT, hf_shell.TOO_BIG_EXIT):
            raise SandboxError(f"could not {action} in sandbox {self.sandbox_id}: {result.stderr.strip()[-500:]}")
        return result

    async def write_file(self, path: str, data: str | bytes) -> None:
        payload = base64.b64encode(data.encode() if isinstance(data, str) else data).decode()
        await self._file_command(hf_shell.write_file(path), f"write {path}", stdin=payload)

    async def read_file(self, path: str) -> bytes:
        result = await self._file_command(hf_shell.read_file(path), f"read {path}")
        if result.exit_code == hf_shell.MISSING_EXIT:
            raise FileNotFoundError(path)
        if result.exit_code == hf_shell.TOO_BIG_EXIT:
            raise SandboxError(f"{path} is larger than {hf_shell.MAX_READ_BYTES} bytes")
        return base64.b64decode(result.stdout)

    async def read_tail(self, path: str, limit: int) -> bytes:
        result = await self._file_command(hf_shell.read_tail(path, limit), f"read {path}")
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

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        """Root makes the work dir and the verifier directory the grader's (never following a link the agent left);
        the grader then writes each protected file itself."""
        workdir = self._spec.workdir
        script = handoff_script(protected, workdir)
        result = await self._file_command(script, "hand the work dir to the grader", identity="root")
        if result.exit_code != 0:
            raise SandboxError(f"could not hand the work dir to the grader: {result.stderr.strip()[-500:]}")
        for path, text in protected.items():
            payload = base64.b64encode(text.encode()).decode()
            target = task_path(path, workdir)
            await self._file_command(hf_shell.write_file(target), f"write {target}", stdin=payload, identity="grader")

    async def run_root(self, cmd: str, timeout_s: float) -> tuple[int | None, str]:
        result = await self.run(cmd, timeout_s=timeout_s, cwd="/", identity="root", max_output_bytes=64 * 2**20)
        return result.exit_code, result.stdout if result.exit_code == 0 else result.stderr

    async def write_root_file(self, path: str, data: str) -> None:
        payload = base64.b64encode(data.encode()).decode()
        await self._file_command(hf_shell.write_file(path), f"write {path}", stdin=payload, identity="root")

    async def start_root(self, cmd: str, env: dict[str, str]) -> HFProcess:
        return await self._start(cmd, env=env, cwd="/", identity="root")

    async def start_proxy(self, launch: ProxyLaunch) -> RootProxy:
        """As root, from a directory only root can open: `user` cannot read its key, its trace or its memory."""
        return await start_root_proxy(self, launch)

    def limits_hit(self) -> list[LimitHit]:
        return []

    async def list_files(self, root: str, *, limit: int) -> list[FileEntry]:
        result = await self._file_command(hf_shell.list_files(root, limit), f"list {root}")
        return hf_shell.parse_listing(result.stdout)

    async def close(self) -> None:
        await self._closer()

    async def _close(self) -> None:
        try:
            await self.calls(self.sdk.kill, timeout_s=KILL_TIMEOUT_S, action="kill the sandbox")
        except SandboxError as error:
            log.error("killing HF sandbox %s failed: %s (opencode-env reap will find it)", self.sandbox_id, error)
        finally:
            self._release()


class HFBackend:
    """Creates dedicated HF sandboxes, at most `max_sandboxes` alive at once, creations staggered."""

    name = "hf"

    def __init__(
        self,
        *,
        sandbox_class: Any = Sandbox,
        token: str | None = None,
        image: str | None = None,
        flavor: str | None = None,
        namespace: str | None = None,
        max_sandboxes: int | None = None,
        tools_dir: str = hf_shell.DEFAULT_TOOLS_DIR,
        server_id: str = "",
    ) -> None:
        self._sandbox_class = sandbox_class
        self._token_override = token
        self._image = image or default_image()
        self._flavor = flavor or os.environ.get(FLAVOR_VAR, "cpu-basic")
        self._namespace = namespace or os.environ.get(NAMESPACE_VAR) or None
        limit = max_sandboxes or limit_from_env(MAX_SANDBOXES_VAR, DEFAULT_MAX_SANDBOXES)
        self._admission = Admission(limit, stagger_s=CREATE_STAGGER_S)
        self._calls = Calls(threads=4 * limit + 8)
        self._tools_dir = tools_dir
        self._server_id = label_value(server_id or f"{os.uname().nodename}-{os.getpid()}")
        self._open = OpenSandboxes()

    def _token(self) -> str:
        token = self._token_override or get_token()
        if not token:
            raise SandboxError("HF_TOKEN is not set: the hf backend creates sandboxes with a Hugging Face token")
        return token

    async def create(self, spec: SandboxSpec) -> HFSandbox:
        if spec.network != "internet":
            raise SandboxError(
                f"the hf backend cannot limit a sandbox's network (network={spec.network!r}): its Job reaches the "
                "internet; use network='internet', or the local backend for model_only"
            )
        token = self._token()
        image = spec.template or self._image
        await self._admission.acquire()
        try:
            sdk = await self._create_killing_if_cancelled(spec, image, token)
            try:
                tools = await self._prepare(sdk, spec)
            except BaseException:
                killing = asyncio.wrap_future(self._calls.submit(sdk.kill))
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(killing), timeout=KILL_TIMEOUT_S)
                raise
        except BaseException:
            self._admission.release()
            raise
        opened: HFSandbox

        def release() -> None:
            self._admission.release()
            self._open.discard(opened)

        opened = HFSandbox(
            sdk, tools, env=spec.env, calls=self._calls, tools_dir=self._tools_dir, release=release, spec=spec
        )
        self._open.add(opened)
        return opened

    async def close_all(self) -> int:
        return await self._open.close_all()

    async def _create_killing_if_cancelled(self, spec: SandboxSpec, image: str, token: str) -> Any:
        create = functools.partial(
            self._sandbox_class.create,
            image=image,
            flavor=self._flavor,
            idle_timeout=int(spec.lifetime_s) + LIFETIME_MARGIN_S,
            namespace=self._namespace,
            labels={
                TAG: "1",
                f"{TAG}-server": self._server_id,
                f"{TAG}-task": label_value(spec.task_id),
                f"{TAG}-created": str(int(time.time())),
            },
            start_timeout=START_TIMEOUT_S,
            token=token,
        )
        creating = asyncio.wrap_future(self._calls.submit(create))
        try:
            return await asyncio.wait_for(asyncio.shield(creating), timeout=START_TIMEOUT_S + CALL_GRACE_S)
        except (asyncio.CancelledError, TimeoutError) as stopped:
            creating.add_done_callback(self._kill_when_created)
            if isinstance(stopped, TimeoutError):
                raise SandboxError(
                    f"the HF sandbox (image {image!r}) was not ready within {START_TIMEOUT_S:.0f} s"
                ) from None
            raise
        except Exception as error:
            raise sdk_error(error, "create a sandbox", image) from error

    def _kill_when_created(self, creating: asyncio.Future[Any]) -> None:
        if creating.cancelled() or creating.exception() is not None:
            return
        sdk = creating.result()
        log.warning("creation of HF sandbox %s finished after its rollout stopped waiting: killing it", sdk.id)
        self._calls.submit(sdk.kill)

    @staticmethod
    async def _probe(probe: HFSandbox) -> tuple[str | None, bool]:
        """What the image has: OpenCode as `user` runs it, the proxy's packages as root imports them."""
        opencode = await probe.run(hf_shell.OPENCODE_PROBE, timeout_s=CALL_TIMEOUT_S, cwd="/")
        proxy = await probe.run(hf_shell.PROXY_PROBE, timeout_s=CALL_TIMEOUT_S, cwd="/", identity="root")
        return hf_shell.parse_probe(opencode.stdout + proxy.stdout)

    async def _prepare(self, sdk: Any, spec: SandboxSpec) -> ProvidedTools:
        """Make `user` and its home, find what the image has, install OpenCode when it lacks it, start the watchdog."""
        probe = HFSandbox(
            sdk, ProvidedTools(), env={}, calls=self._calls, tools_dir=self._tools_dir, release=lambda: None
        )
        prepared = await probe.run(hf_shell.prepare_image(), timeout_s=PREPARE_TIMEOUT_S, cwd="/", identity="root")
        if prepared.exit_code != 0:
            raise SandboxError(f"preparing HF sandbox {sdk.id} failed: {prepared.stderr.strip()[-800:]}")
        await probe.start_root(hf_shell.watchdog(spec.lifetime_s + LIFETIME_MARGIN_S), {})
        version, proxy_ready = await self._probe(probe)
        for missing, script in (
            (version is None, hf_shell.install_opencode(self._tools_dir)),
            (not proxy_ready, hf_shell.install_proxy_packages()),
        ):
            if not missing:
                continue
            installed = await probe.run(script, timeout_s=INSTALL_TIMEOUT_S, cwd="/", identity="root")
            if installed.exit_code != 0:
                raise SandboxError(f"installing in HF sandbox {sdk.id} failed: {installed.stderr.strip()[-800:]}")
        if version is None or not proxy_ready:
            version, proxy_ready = await self._probe(probe)
        return ProvidedTools(
            opencode="opencode" if version else None,
            opencode_version=version,
            python="python3",
            proxy_ready=proxy_ready,
        )
