"""A local sandbox's processes: how a command is started inside it (its environment, its identity), run to the end
under a timeout, or left running; and the capture proxy's process, in its own compartment beside the sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    HOME,
    PROXY_TOKEN_ENV_NAME,
    WORKDIR,
    Identity,
    ProxyLaunch,
    SandboxError,
)
from opencode_env.sandbox.local.compartment import Compartment
from opencode_env.sandbox.local.isolation import netns
from opencode_env.sandbox.local.isolation.bubblewrap import (
    AGENT_HOME,
    AGENT_ONLY_ENV,
    AGENT_TMP,
    CONTROL_MOUNT,
    GRADER_HOME,
    proxy_argv,
    runtime_inside,
)
from opencode_env.sandbox.local.isolation.cgroup import cgroup_prefix
from opencode_env.sandbox.local.isolation.command_argv import TOOL_ENV, TOOL_SHELL, Roles, command_argv
from opencode_env.sandbox.local.isolation.host_runtime import BASE_PATH
from opencode_env.sandbox.local.isolation.host_view import HELPERS, runtime_paths, trust_settings
from opencode_env.sandbox.local.proxy import LocalProxy
from opencode_env.sandbox.local.sandbox_boot import EGRESS_PORT, SandboxBoot
from opencode_env.sandbox.output import BoundedOutput
from opencode_env.wire import CommandResult

PIPE_DRAIN_S = 2.0
AGENT_ENV_PREFIX = "OPENCODE_"
"""The names of an `agent` command's env that are OpenCode's (its config, its key, its switches): a caller's `env`
may not use them (wire validation), and the agent's tools never get them."""


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


class SandboxProcesses:
    """Starts commands inside a booted sandbox (its environment, its identity, its cgroup) and owns every process it
    started, the capture proxy's included, until `kill_all`."""

    def __init__(self, compartment: Compartment, boot: SandboxBoot) -> None:
        self._compartment = compartment
        self._boot = boot
        self._processes: set[LocalProcess] = set()

    async def kill_all(self) -> None:
        for process in list(self._processes):
            await process.kill()
        self._processes.clear()

    def _environment(self, extra: Mapping[str, str] | None, identity: Identity) -> dict[str, str]:
        """A command's environment: the task's for every identity but `agent`, whose process is OpenCode (its
        environment is ours alone, see _opencode_environment); its tools get the task's (TOOL_ENV)."""
        if identity == "agent":
            return self._opencode_environment(extra or {})
        return self._task_environment(extra or {}, identity)

    def _task_environment(self, extra: Mapping[str, str], identity: Identity) -> dict[str, str]:
        """What the task's own commands (setup, the agent's tools, verify) run with: the image's ENV, ours, the
        backend's and then the caller's."""
        compartment = self._compartment
        image_env = compartment.image.env if compartment.image is not None else {}
        path = ":".join(
            [
                *compartment.sandbox_path,
                *map(runtime_inside, compartment.extra_path),
                image_env.get("PATH", BASE_PATH),
            ]
        )
        if compartment.tools.opencode and compartment.image is None:
            path = f"{Path(compartment.tools.opencode).parent}:{path}"
        home = HOME
        if identity == "grader":
            home = "/root" if compartment.spec.grader_is_root else GRADER_HOME
        env = {**image_env, "PATH": path, "HOME": home, "USER": "user", "TERM": "dumb", "TMPDIR": "/tmp"}
        env.setdefault("LANG", "C.UTF-8")
        env.update(self._egress_proxy())
        env.update({name: compartment.runtime.inside(value) for name, value in trust_settings(os.environ).items()})
        env.update(compartment.spec.env)
        env.update(extra)
        return env

    def _opencode_environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        """OpenCode's environment, from an allow-list: our settings and the OPENCODE_* names the pipeline gives it
        (its config, its key). Nothing of the image's ENV or the caller's `env` (those go to its tools only): such
        a variable could name a config, a plugin, a preload or a proxy for OpenCode (OPENCODE_CONFIG_CONTENT,
        OPENCODE_CONFIG_DIR, NODE_OPTIONS, BUN_OPTIONS, LD_PRELOAD, ...)."""
        opencode = self._compartment.tools.opencode
        path = f"{Path(opencode).parent}:{BASE_PATH}" if opencode else BASE_PATH
        env = {"PATH": path, "HOME": AGENT_HOME, "USER": "user", "TERM": "dumb", "TMPDIR": AGENT_TMP}
        env["LANG"] = "C.UTF-8"
        env.update(self._egress_proxy(task=False))
        env.update({name: runtime_inside(value) for name, value in trust_settings(os.environ).items()})
        env.update(AGENT_ONLY_ENV, SHELL=TOOL_SHELL)
        env.update({name: value for name, value in extra.items() if name.startswith(AGENT_ENV_PREFIX)})
        return env

    def _egress_proxy(self, *, task: bool = True) -> dict[str, str]:
        """The egress proxy for everything but loopback; for the task's commands, the rollout's service names are
        loopback too (its /etc/hosts, which OpenCode does not read, says so)."""
        if self._compartment.share_host_network:
            return {}
        proxy = f"http://127.0.0.1:{EGRESS_PORT}"
        env = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), proxy)
        names = self._compartment.local_names if task else ()
        local = ",".join(("127.0.0.1", "localhost", *names))
        return {**env, "NO_PROXY": local, "no_proxy": local}

    def _write_tool_environment(self, extra: Mapping[str, str]) -> None:
        """TOOL_ENV, the agent's tools' environment: the task's, as `user`, without OpenCode's own names."""
        tools = {name: value for name, value in extra.items() if not name.startswith(AGENT_ENV_PREFIX)}
        target = self._compartment.layout.control / os.path.relpath(TOOL_ENV, CONTROL_MOUNT)
        target.write_bytes(environment_bytes(self._task_environment(tools, "user")))

    async def _spawn(
        self,
        cmd: str,
        cwd: str,
        env: Mapping[str, str] | None,
        stdout: int,
        stderr: int,
        *,
        own_pid_namespace: bool = True,
        identity: Identity = "user",
    ) -> asyncio.subprocess.Process:
        compartment = self._compartment
        if identity == "agent":
            self._write_tool_environment(env or {})
        environment = os.memfd_create("command-env", os.MFD_CLOEXEC)
        try:
            os.write(environment, environment_bytes(self._environment(env, identity)))
            argv = command_argv(
                self._boot.holder_pid,
                compartment.ids,
                cmd,
                cwd,
                own_pid_namespace=own_pid_namespace,
                identity=identity,
                helpers=HELPERS,
                env_fd=environment,
                tmp_mb=compartment.spec.limits.disk_mb,
                runtime=compartment.runtime,
                roles=Roles(grader_is_root=compartment.spec.grader_is_root),
            )
            prefix = cgroup_prefix(self._boot.cgroup) if own_pid_namespace else self._boot.services_prefix()
            return await asyncio.create_subprocess_exec(
                *prefix,
                *argv,
                env={"PATH": BASE_PATH},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                pass_fds=(environment,),
            )
        finally:
            os.close(environment)

    async def pause_services(self) -> bool:
        """Freeze every process setup left running (and wait until they are); False where there is no freezer."""
        services = self._boot.services
        if services is None:
            return False
        try:
            await asyncio.to_thread(services.freeze)
        except OSError as error:
            raise SandboxError(f"setup's services could not be frozen: {error}") from error
        return True

    async def resume_services(self) -> None:
        services = self._boot.services
        if services is not None:
            await asyncio.to_thread(services.thaw)

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
        started = time.monotonic()
        process = await self._spawn(
            cmd,
            cwd,
            env,
            subprocess.PIPE,
            subprocess.PIPE,
            own_pid_namespace=not keep_background,
            identity=identity,
        )
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
            if timed_out or not keep_background or _cancelling():
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

    async def spawn(
        self,
        cmd: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKDIR,
        identity: Identity = "user",
        own_pid_namespace: bool = True,
    ) -> LocalProcess:
        """A process with piped stdout and stderr, owned (and killed on close) by the sandbox; without a pid
        namespace of its own it shares the sandbox's, as every process of a VM does (the cloud fakes)."""
        process = await self._spawn(
            cmd, cwd, env, subprocess.PIPE, subprocess.PIPE, identity=identity, own_pid_namespace=own_pid_namespace
        )
        handle = LocalProcess(process)
        self._processes.add(handle)
        return handle

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> LocalProcess:
        """A background command whose output goes to `log_path`, opened by the command itself inside the sandbox
        (so the server never opens a path the sandbox could have replaced)."""
        logged = f'mkdir -p "$(dirname {_quote(log_path)})" && exec >> {_quote(log_path)} 2>&1; {cmd}'
        process = await self._spawn(logged, cwd, env, subprocess.DEVNULL, subprocess.DEVNULL)
        handle = LocalProcess(process)
        self._processes.add(handle)
        return handle

    async def start_proxy(self, launch: ProxyLaunch) -> LocalProxy:
        """The capture proxy, in its own compartment outside the sandbox, listening on 127.0.0.1 inside it."""
        layout, ids = self._compartment.layout, self._compartment.ids
        listener = netns.listen_in(self._boot.holder_pid)
        # The sandbox's TCP table, opened here (as root, from the host's user namespace: its uids are host uids),
        # read by the proxy for each call to check that OpenCode's own uid owns the calling socket.
        peer_table = os.open(f"/proc/{self._boot.holder_pid}/net/tcp", os.O_RDONLY | os.O_CLOEXEC)
        try:
            token = secrets.token_urlsafe(24)
            program = [
                launch.python,
                "-I",
                "-m",
                "opencode_env.proxy",
                *launch.args,
                "--listen-fd",
                str(listener.fileno()),
                "--admin-socket",
                str(layout.sockets / "admin.sock"),
                "--trace",
                str(layout.private / "trace.jsonl"),
                "--token-env",
                PROXY_TOKEN_ENV_NAME,
                "--peer-table-fd",
                str(peer_table),
                "--peer-uid",
                str(ids.agent),
            ]
            argv = proxy_argv(layout, ids, runtime_paths(self._compartment.host_tools), program)
            proxy_cgroup = self._boot.proxy_cgroup
            if proxy_cgroup is not None:
                argv = [*proxy_cgroup.join_prefix(), *argv]
            log_file = layout.private / "proxy.log"
            with log_file.open("ab") as log_handle:
                os.fchown(log_handle.fileno(), ids.root, ids.root)
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env={"PATH": BASE_PATH, PROXY_TOKEN_ENV_NAME: token, **launch.env},
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle.fileno(),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(listener.fileno(), peer_table),
                )
            port = listener.getsockname()[1]
        finally:
            listener.close()
            os.close(peer_table)
        handle = LocalProcess(process)
        self._processes.add(handle)
        return LocalProxy(handle, layout.private, layout.sockets / "admin.sock", port=port, token=token)


def environment_bytes(env: Mapping[str, str]) -> bytes:
    """NUL-separated NAME=VALUE entries, as seccomp_exec.py reads them (a NUL in a value cannot be passed)."""
    return b"".join(f"{name}={value}".encode() + b"\0" for name, value in env.items() if "\0" not in value)


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _drain(stream: asyncio.StreamReader, out: BoundedOutput) -> None:
    while chunk := await stream.read(65536):
        out.feed(chunk)
