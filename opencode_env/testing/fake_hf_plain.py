"""The fake HF cloud's plain mode: a sandbox's commands run as plain processes of the machine the fake runs on,
which then plays the sandbox's VM.

It is for the image's smoke test: inside the container, the container is that VM. A real HF sandbox is a container
whose sandbox server runs as root (PID 1) and runs every command as root; the backend drops task commands to
`user` with setpriv and runs the proxy as root. Run as root here, the same commands do the same thing for real
(the real setpriv, the real `user`, the real /home/user and /opt/opencode-env): no stand-in is needed.

One sandbox at a time: its paths are this machine's own, so a second sandbox would share them. What a sandbox
writes stays on disk after it closes (a VM's disk would go with it). Closing it kills the process group of every
command it started; a process that left its group (setsid) outlives it, where a VM's would not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from opencode_env.sandbox.local.services import LocalProcess


class PlainProcess(LocalProcess):
    """A command of the plain machine, led by its own process group (session)."""

    async def kill(self) -> None:
        """Kill its whole group, also what it left behind after it exited itself."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        await self.process.wait()


class PlainMachine:
    """This machine as one fake sandbox: commands run with `/bin/sh -c` as the fake's own user, in `image_env`
    (what the image's sandbox server would pass on) plus each command's own variables."""

    def __init__(self, image_env: Mapping[str, str]) -> None:
        self._image_env = dict(image_env)
        self._processes: list[PlainProcess] = []

    async def spawn(self, cmd: str, *, env: Mapping[str, str] | None = None, cwd: str = "/") -> PlainProcess:
        """A process with piped stdout and stderr, in a session of its own; killed when the machine closes."""
        process = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**self._image_env, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        handle = PlainProcess(process)
        self._processes.append(handle)
        return handle

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Written as the fake's own user (root, as the SDK's file API), readable by it alone."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        await asyncio.to_thread(_write_private, Path(path), raw)

    async def read_file(self, path: str) -> bytes:
        return await asyncio.to_thread(Path(path).read_bytes)

    async def close(self) -> None:
        processes, self._processes = self._processes, []
        for process in processes:
            await process.kill()


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
