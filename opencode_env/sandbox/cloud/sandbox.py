"""The sandbox contract on a cloud VM, as every cloud backend (E2B, Hugging Face) keeps it: commands by identity,
the capture proxy and the grader hand-over through root, closing once. A provider's sandbox runs commands and moves
files through its SDK (`_run_as`, `_start_as`, `_write_as`) and kills its VM (`_kill_vm`)."""

from __future__ import annotations

import os
import secrets
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

from opencode_env.sandbox.base import (
    AGENT_LOG_DIR,
    DEFAULT_MAX_OUTPUT_BYTES,
    HOME,
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
from opencode_env.sandbox.cloud.agent_env import AgentRoot, split_agent_env, tool_broker_source
from opencode_env.sandbox.cloud.carry import carry_between
from opencode_env.sandbox.cloud.grader import handoff_script, seal_script
from opencode_env.sandbox.cloud.lifecycle import kill_quietly
from opencode_env.sandbox.cloud.root_proxy import RootProxy, start_root_proxy
from opencode_env.sandbox.output import BoundedOutput
from opencode_env.wire import CommandResult, LimitHit
from opencode_env.wire.task_paths import OutsideTaskRoots, confined_file

ROOT_OUTPUT_BYTES = 64 * 2**20
HANDOFF_TIMEOUT_S = 120
TASK_USER = "user"
STOP_ALL = "kill -STOP -1 2>/dev/null; true"
CONTINUE_ALL = "kill -CONT -1 2>/dev/null; true"
"""kill(-1) reaches every process the caller may signal but itself: all of `user`'s; none may be left (ESRCH)."""
BROKER_WAIT_S = 20.0


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
        self.agent_root = AgentRoot(f"/tmp/opencode-env-agent-{secrets.token_hex(8)}")
        self._python: str | None = None
        self.opencode_data_dir = f"{self.agent_root.home}/data"
        self.opencode_isolated = True

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
        `keep_background` says (setup's services rely on it). OpenCode (`agent`) starts as its own uid with an
        environment from an allow-list, its tools as `user` with the task's, through the broker (agent_env.py)."""
        self._check_open()
        if identity != "agent":
            return await self._run_as(identity, cmd, timeout_s=timeout_s, env=env, cwd=cwd, limit=max_output_bytes)
        command, own, broker = await self._opencode_command(cmd, env or {})
        try:
            return await self._run_as("root", command, timeout_s=timeout_s, env=own, cwd=cwd, limit=max_output_bytes)
        finally:
            await broker.kill()

    async def made_agent_root(self) -> AgentRoot:
        """OpenCode's directories (see AgentRoot), made once, before anything of OpenCode's is written."""
        if self._python is None:
            exit_code, output = await self.run_root(self.agent_root.make_script(TASK_USER), 30)
            if exit_code != 0 or not output.strip():
                raise SandboxError(f"could not make OpenCode's directories in {self.sandbox_id}: {output[-500:]}")
            self._python = output.strip().splitlines()[-1]
        return self.agent_root

    async def _opencode_command(
        self, cmd: str, env: Mapping[str, str]
    ) -> tuple[str, dict[str, str], BackgroundProcess]:
        """OpenCode's command (run by root, which drops to OpenCode's uid), its own variables, and the tools'
        broker, started here with the task's environment for the tools."""
        own, tools = split_agent_env(env)
        root = await self.made_agent_root()
        python = self._python or "python3"
        await self.write_root_file(root.broker, tool_broker_source())
        task_env = {**self._spec.env, **tools}
        await self.write_root_file(
            root.broker_config, root.broker_config_text(user=TASK_USER, home=HOME, task_env=task_env)
        )
        await self.write_root_file(root.shell, root.tool_shell(python))
        exit_code, output = await self.run_root(
            f"chmod 600 {shlex.quote(root.broker_config)} && chmod 644 {shlex.quote(root.broker)}"
            f" && chmod 755 {shlex.quote(root.shell)} && rm -f {shlex.quote(root.socket)}",
            30,
        )
        if exit_code != 0:
            raise SandboxError(f"could not make the tools' shell in {self.sandbox_id}: {output[-500:]}")
        broker = await self.start_root(root.broker_command(python), {})
        tries, socket = int(BROKER_WAIT_S * 20), shlex.quote(root.socket)
        wait = f"for i in $(seq 1 {tries}); do test -S {socket} && exit 0; sleep 0.05; done; exit 1"
        exit_code, output = await self.run_root(wait, BROKER_WAIT_S + 5)
        if exit_code != 0:
            await broker.kill()
            _, log_tail = await self.run_root(f"tail -c 2000 {shlex.quote(root.path)}/broker.log", 30)
            raise SandboxError(f"the tools' broker did not start in {self.sandbox_id}: {log_tail}")
        shared = shlex.join([self._spec.workdir, AGENT_LOG_DIR])
        await self._run_as(
            "user", f"chmod -R g+rwX -- {shared} 2>/dev/null; true", timeout_s=60, env=None, cwd="/", limit=4096
        )
        return root.launch(cmd, own, TASK_USER), own, broker

    def _owner_of(self, path: str) -> Identity:
        """Who reads `path`: root inside OpenCode's private directories, `user` elsewhere."""
        inside = path == self.agent_root.path or path.startswith(self.agent_root.path + "/")
        return "root" if inside else "user"

    async def start(
        self, cmd: str, *, log_path: str, env: Mapping[str, str] | None = None, cwd: str = WORKDIR
    ) -> BackgroundProcess:
        self._check_open()
        logged = f"mkdir -p {shlex.quote(os.path.dirname(log_path))} && exec >> {shlex.quote(log_path)} 2>&1; {cmd}"
        return await self._start_as("user", logged, env=env, cwd=cwd)

    async def write_file(self, path: str, data: str | bytes) -> None:
        """A task's file, inside the task's roots only (wire/task_paths.py): OpenCode's config and data dirs in
        the home it shares with the tools, and everything of the VM's own, are out of a request's reach."""
        await self._write_as("user", self._task_file(path), data)

    def _task_file(self, path: str) -> str:
        try:
            return confined_file(path, self._spec.workdir)
        except OutsideTaskRoots as error:
            raise SandboxError(f"refusing to write {path[:200]!r}, outside the task's roots: {error}") from None

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
        targets = {self._task_file(task_path(path, workdir)): text for path, text in protected.items()}
        exit_code, output = await self.run_root(handoff_script(protected, workdir), HANDOFF_TIMEOUT_S)
        if exit_code != 0:
            raise SandboxError(f"could not hand the work dir to the grader in {self.sandbox_id}: {output[-500:]}")
        for target, text in targets.items():
            await self._write_as("grader", target, text)
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

    async def pause_services(self) -> bool:
        """Every process of `user` stopped (SIGSTOP, which no process can catch or ignore, sent by one kill(-1) as
        `user`): what setup left running cannot re-plant OpenCode's project configuration between its removal and
        OpenCode reading it. Root's leftovers (setup_as="root") are the VM's root and are not stopped."""
        result = await self._run_as("user", STOP_ALL, timeout_s=60, env=None, cwd="/", limit=4096)
        if result.exit_code != 0:
            raise SandboxError(f"setup's processes could not be stopped in {self.sandbox_id}: {result.stderr[-500:]}")
        return True

    async def resume_services(self) -> None:
        await self._run_as("user", CONTINUE_ALL, timeout_s=60, env=None, cwd="/", limit=4096)

    def limits_hit(self) -> list[LimitHit]:
        return []

    async def services_down(self) -> list[str]:
        return []

    async def close(self) -> None:
        await self._closer()

    async def _close(self) -> None:
        try:
            await kill_quietly(self.backend, self.sandbox_id, self._kill_vm())
        finally:
            self._release()
