"""The sandbox contract on a cloud VM, as every cloud backend (E2B, Hugging Face) keeps it: commands by identity,
the capture proxy and the grader hand-over through root, closing once. A provider's sandbox runs commands and moves
files through its SDK (`_run_as`, `_start_as`, `_write_as`) and kills its VM (`_kill_vm`)."""

from __future__ import annotations

import os
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

from opencode_env.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    OPENCODE_DATA_DIR,
    WORKDIR,
    BackgroundProcess,
    CarryLimits,
    CarryReport,
    CloseOnce,
    Identity,
    ProvidedTools,
    ProxyLaunch,
    RolloutSandbox,
    SandboxError,
    SandboxSpec,
    task_path,
)
from opencode_env.sandbox.cloud.agent_env import (
    OPENCODE_ALLOWED,
    allow_listed,
    env_file_text,
    split_agent_env,
    tool_shell,
)
from opencode_env.sandbox.cloud.carry import carry_between
from opencode_env.sandbox.cloud.grader import handoff_script, seal_script
from opencode_env.sandbox.cloud.lifecycle import kill_quietly
from opencode_env.sandbox.cloud.root_proxy import RootProxy, start_root_proxy
from opencode_env.sandbox.output import BoundedOutput
from opencode_env.wire import CommandResult, LimitHit

ROOT_OUTPUT_BYTES = 64 * 2**20
HANDOFF_TIMEOUT_S = 120


class Capture:
    """A command's output as the SDK streams it (head and tail kept, the middle counted) and how long it ran."""

    def __init__(self, cmd: str, limit: int) -> None:
        self._cmd = cmd
        self._stdout, self._stderr = BoundedOutput(limit), BoundedOutput(limit)
        self._started = time.monotonic()

    def on_stdout(self, text: str) -> None:
        self._stdout.feed(text.encode())

    def on_stderr(self, text: str) -> None:
        self._stderr.feed(text.encode())

    def note(self, text: str) -> None:
        """Our own words at the end of stderr, where the command's own output stops."""
        self._stderr.feed(text.encode())

    def result(self, exit_code: int | None, *, timed_out: bool) -> CommandResult:
        return CommandResult(
            cmd=self._cmd,
            exit_code=exit_code,
            stdout=self._stdout.text(),
            stderr=self._stderr.text(),
            duration_s=round(time.monotonic() - self._started, 4),
            timed_out=timed_out,
            output_truncated=self._stdout.truncated or self._stderr.truncated,
        )


class CloudSandbox(ABC):
    backend: str
    enforcement: dict[str, str]

    def __init__(
        self, sandbox_id: str, tools: ProvidedTools, spec: SandboxSpec | None, release: Callable[[], None]
    ) -> None:
        self.sandbox_id = sandbox_id
        self.tools = tools
        self._spec = spec or SandboxSpec()
        self._release = release
        self._closer = CloseOnce(self._close)
        self.opencode_data_dir = OPENCODE_DATA_DIR
        self.opencode_isolated = False

    @abstractmethod
    async def _run_as(
        self, identity: Identity, cmd: str, *, timeout_s: float, env: Mapping[str, str] | None, cwd: str, limit: int
    ) -> CommandResult:
        """Run `cmd` to its end or its timeout, its output bounded by `limit` bytes a stream."""

    @abstractmethod
    async def _start_as(
        self, identity: Identity, cmd: str, *, env: Mapping[str, str] | None, cwd: str
    ) -> BackgroundProcess: ...

    @abstractmethod
    async def _write_as(self, identity: Identity, path: str, data: str | bytes) -> None:
        """Write the file as `identity` (the grader's: as the grader user, also where verify runs as root)."""

    @abstractmethod
    async def _kill_vm(self) -> None:
        """Kill the VM and what runs in it; SandboxError when the provider does not."""

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
        """What a command leaves in the background lives on in the VM until the sandbox closes, whatever
        `keep_background` says (setup's services rely on it). OpenCode (`agent`) starts with an environment from an
        allow-list, its tools with the task's (see agent_env.py)."""
        self._check_open()
        if identity == "agent":
            cmd, env = await self._opencode_command(cmd, env or {})
        return await self._run_as(identity, cmd, timeout_s=timeout_s, env=env, cwd=cwd, limit=max_output_bytes)

    async def _opencode_command(self, cmd: str, env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        own, tools = split_agent_env(env)
        exit_code, output = await self.run_root(
            "d=$(mktemp -d /tmp/opencode-env-shell-XXXXXXXX) && chmod 755 $d && echo $d", 30
        )
        if exit_code != 0:
            raise SandboxError(f"could not make the tools' shell in {self.sandbox_id}: {output[-500:]}")
        directory = output.strip()
        await self.write_root_file(f"{directory}/env", env_file_text({**self._spec.env, **tools}))
        await self.write_root_file(f"{directory}/bash", tool_shell(f"{directory}/env", own))
        exit_code, output = await self.run_root(f"chmod 644 {directory}/env && chmod 755 {directory}/bash", 30)
        if exit_code != 0:
            raise SandboxError(f"could not make the tools' shell in {self.sandbox_id}: {output[-500:]}")
        own["SHELL"] = f"{directory}/bash"
        return allow_listed(cmd, [*OPENCODE_ALLOWED, *own]), own

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> BackgroundProcess:
        self._check_open()
        logged = f"mkdir -p {shlex.quote(os.path.dirname(log_path))} && exec >> {shlex.quote(log_path)} 2>&1; {cmd}"
        return await self._start_as("user", logged, env=env, cwd=cwd)

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self._write_as("user", path, data)

    async def run_root(self, cmd: str, timeout_s: float) -> tuple[int | None, str]:
        result = await self.run(cmd, timeout_s=timeout_s, cwd="/", identity="root", max_output_bytes=ROOT_OUTPUT_BYTES)
        return result.exit_code, result.stdout if result.exit_code == 0 else result.stderr

    async def write_root_file(self, path: str, data: str) -> None:
        await self._write_as("root", path, data)

    async def write_root_bytes(self, path: str, data: bytes) -> None:
        await self._write_as("root", path, data)

    async def start_root(self, cmd: str, env: dict[str, str]) -> BackgroundProcess:
        self._check_open()
        return await self._start_as("root", cmd, env=env, cwd="/")

    async def start_proxy(self, launch: ProxyLaunch) -> RootProxy:
        """As root, from a directory only root can open: `user` cannot read its key, its trace or its memory."""
        return await start_root_proxy(self, launch)

    async def hand_to_grader(self, protected: Mapping[str, str]) -> None:
        """Root makes the work dir and the verifier directory the grader's (never following a link the agent left);
        the grader then writes each protected file itself, so no path the agent planted can make root write."""
        workdir = self._spec.workdir
        exit_code, output = await self.run_root(handoff_script(protected, workdir), HANDOFF_TIMEOUT_S)
        if exit_code != 0:
            raise SandboxError(f"could not hand the work dir to the grader in {self.sandbox_id}: {output[-500:]}")
        for path, text in protected.items():
            await self._write_as("grader", task_path(path, workdir), text)
        if not protected:
            return
        exit_code, output = await self.run_root(seal_script(protected, workdir), HANDOFF_TIMEOUT_S)
        if exit_code != 0:
            raise SandboxError(f"could not seal the handed files in {self.sandbox_id}: {output[-500:]}")

    async def carry_workdir_to(
        self, target: RolloutSandbox, *, keep: tuple[str, ...], limits: CarryLimits
    ) -> CarryReport:
        """Handed to the grader first (see cloud/carry.py), then copied by root's walker into `target`."""
        if not isinstance(target, CloudSandbox):
            raise SandboxError(f"a {self.backend} sandbox's work dir goes to another of its kind, not {target.backend}")
        target._check_open()
        await self.hand_to_grader({})
        return await carry_between(self, target, workdir=self._spec.workdir, keep=keep, limits=limits)

    def limits_hit(self) -> list[LimitHit]:
        return []

    async def close(self) -> None:
        await self._closer()

    async def _close(self) -> None:
        try:
            await kill_quietly(self.backend, self.sandbox_id, self._kill_vm())
        finally:
            self._release()
