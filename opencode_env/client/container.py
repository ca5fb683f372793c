"""This repository's image run on this machine (podman or docker) for `OpenCodeEnv.from_docker_image`.

The same contract as openenv-core's `LocalDockerProvider` (`start_container(image, port, env_vars) -> base_url`,
`wait_for_ready`, `stop_container`) without openenv-core, and two differences: the port is published on loopback
only, and environment values (a token, a key) reach the engine through its environment, never its argv (`-e NAME`).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping

SERVER_PORT = 8000
ENGINES = ("podman", "docker")
READY_POLL_S = 0.5
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def find_engine() -> str:
    for name in ENGINES:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(f"from_docker_image needs a container engine: none of {', '.join(ENGINES)} is on PATH")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run_argv(engine: str, image: str, *, name: str, port: int, env_names: list[str]) -> list[str]:
    """The engine's `run` command: detached, removed when stopped, the server's port on loopback only, each variable
    by name (its value comes from the engine's environment)."""
    if not image.strip() or image.startswith("-") or any(c.isspace() for c in image):
        raise ValueError(f"image: an image reference, e.g. ghcr.io/OWNER/opencode-env:latest; got {image!r}")
    unnamed = [variable for variable in env_names if not VARIABLE_NAME.fullmatch(variable)]
    if unnamed:
        raise ValueError(f"env_vars: names must be like OPENCODE_ENV_TOKEN ([A-Za-z_][A-Za-z0-9_]*); got {unnamed}")
    argv = [engine, "run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:{SERVER_PORT}"]
    for variable in env_names:
        argv += ["-e", variable]
    return [*argv, image]


class LocalContainer:
    """One container of an image, started and stopped with the engine's CLI."""

    def __init__(self, engine: str | None = None) -> None:
        self.engine = engine or find_engine()
        self.container_id: str | None = None

    def start_container(self, image: str, port: int | None = None, env_vars: Mapping[str, str] | None = None) -> str:
        """Start the image and return its base URL (http://127.0.0.1:PORT)."""
        port = free_port() if port is None else port
        variables = dict(env_vars or {})
        argv = run_argv(
            self.engine, image, name=f"opencode-env-{uuid.uuid4().hex[:12]}", port=port, env_names=sorted(variables)
        )
        completed = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **variables}, timeout=600, check=False
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"{os.path.basename(self.engine)} could not start {image} (exit {completed.returncode}): "
                f"{completed.stderr.strip()[-2000:]}"
            )
        self.container_id = completed.stdout.strip().splitlines()[-1] if completed.stdout.strip() else None
        return f"http://127.0.0.1:{port}"

    def wait_for_ready(self, base_url: str, timeout_s: float = 300.0) -> None:
        """Until the server's /health answers 200 (the image's server takes seconds to start)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status = httpx.get(f"{base_url}/health", timeout=2.0, trust_env=False).status_code
                last = f"HTTP {status}"
                if status == 200:
                    return
            except httpx.HTTPError as error:
                last = f"{type(error).__name__}: {error}"
            if time.monotonic() + READY_POLL_S > deadline:
                raise TimeoutError(
                    f"the container at {base_url} did not answer /health within {timeout_s:.0f} s: {last}"
                )
            time.sleep(READY_POLL_S)

    def stop_container(self) -> None:
        """Stop the container (`--rm` removes it); one already gone is not an error."""
        if self.container_id is None:
            return
        container, self.container_id = self.container_id, None
        subprocess.run(
            [self.engine, "stop", "-t", "5", container], capture_output=True, text=True, timeout=60, check=False
        )
