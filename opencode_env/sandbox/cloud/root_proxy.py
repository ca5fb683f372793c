"""The capture proxy on a cloud sandbox (E2B, Hugging Face): run as root from a directory only root can open,
while every task command runs as `user` without sudo; admin calls and file reads go through root commands too.
It admits a call only from a socket OpenCode's own uid (or root) owns, read from the VM's TCP table (proxy/peers.py):
a token a tool found gets it nothing."""

from __future__ import annotations

import json
import secrets
import shlex
from typing import Any, Protocol

from opencode_env.sandbox.base import PROXY_TOKEN_ENV_NAME, BackgroundProcess, ProxyLaunch, SandboxError
from opencode_env.sandbox.cloud.agent_env import OPENCODE_UID, allow_listed

PORT_WAIT_S = 20.0
PROXY_ALLOWED = ("PATH", "HOME", "LANG")
PEER_TABLE_FD = 3


class RootRunner(Protocol):
    """What the proxy handle needs from its sandbox: root commands and root file access."""

    async def run_root(self, cmd: str, timeout_s: float) -> tuple[int | None, str]: ...

    async def write_root_file(self, path: str, data: str) -> None: ...

    async def start_root(self, cmd: str, env: dict[str, str]) -> BackgroundProcess: ...


class RootProxy:
    def __init__(self, sandbox: RootRunner, process: BackgroundProcess, private: str, port: int, token: str) -> None:
        self._sandbox = sandbox
        self.process = process
        self._private = private
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.token = token
        # Each question starts a process in the VM.
        self.status_interval_s = 5.0
        self._port = port

    async def running(self) -> bool:
        return await self.process.running()

    async def kill(self) -> None:
        await self.process.kill()

    async def call(self, path: str, method: str, wait_s: float) -> dict[str, Any] | None:
        ping = shlex.join(
            [
                "python3",
                "-m",
                "opencode_env.proxy.ping",
                f"http://127.0.0.1:{self._port}{path}",
                "--method",
                method,
                "--wait",
                f"{wait_s:.1f}",
                "--token-env",
                PROXY_TOKEN_ENV_NAME,
            ]
        )
        command = f"cd {shlex.quote(self._private)}/pkg && {PROXY_TOKEN_ENV_NAME}={shlex.quote(self.token)} {ping}"
        exit_code, stdout = await self._sandbox.run_root(command, wait_s + 5)
        if exit_code != 0:
            return None
        answer = json.loads(stdout)
        return answer if isinstance(answer, dict) else None

    async def read(self, name: str, limit: int) -> bytes:
        path = shlex.quote(f"{self._private}/{name}")
        exit_code, stdout = await self._sandbox.run_root(f"test -f {path} && tail -c {limit} {path}", 60)
        return stdout.encode() if exit_code == 0 else b""


async def start_root_proxy(sandbox: RootRunner, launch: ProxyLaunch) -> RootProxy:
    """Upload the proxy into a fresh root-only directory (its name is random, so a task cannot pre-create it)."""
    private = f"/tmp/opencode-env-proxy-{secrets.token_hex(8)}"
    exit_code, output = await sandbox.run_root(f"mkdir -m 700 {private} && mkdir -m 700 {private}/pkg", 30)
    if exit_code != 0:
        raise SandboxError(f"could not make the proxy's directory: {output[-500:]}")
    for path, text in launch.sources.items():
        await sandbox.write_root_file(f"{private}/pkg/{path}", text)
    token = secrets.token_urlsafe(24)
    args = [
        *launch.args,
        "--port",
        "0",
        "--port-file",
        f"{private}/port",
        "--trace",
        f"{private}/trace.jsonl",
        "--token-env",
        PROXY_TOKEN_ENV_NAME,
        # the VM's TCP table, opened by root: only sockets OpenCode's uid (or root, asking the health) owns may call
        "--peer-table-fd",
        str(PEER_TABLE_FD),
        "--peer-uid",
        str(OPENCODE_UID),
        "--peer-uid",
        "0",
    ]
    command = (
        f"cd {private}/pkg && exec {shlex.quote(launch.python)} -E -s -m opencode_env.proxy {shlex.join(args)}"
        f" >> {private}/proxy.log 2>&1 {PEER_TABLE_FD}< /proc/net/tcp"
    )
    # the VM's environment (its template's ENV, the sandbox's envs) never reaches the proxy: only ours does
    command = allow_listed(command, [*PROXY_ALLOWED, *launch.env, PROXY_TOKEN_ENV_NAME])
    process = await sandbox.start_root(command, {**launch.env, PROXY_TOKEN_ENV_NAME: token})
    tries = int(PORT_WAIT_S * 20)
    wait = f"for i in $(seq 1 {tries}); do test -s {private}/port && break; sleep 0.05; done; cat {private}/port"
    exit_code, port_text = await sandbox.run_root(wait, PORT_WAIT_S + 5)
    try:
        port = int(port_text.strip())
    except ValueError as error:
        await process.kill()
        _, log_tail = await sandbox.run_root(f"tail -c 4000 {private}/proxy.log", 30)
        raise SandboxError(f"the capture proxy did not listen: {log_tail}") from error
    return RootProxy(sandbox, process, private, port, token)
