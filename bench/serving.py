"""A server process for a bench: a free port, a start it waits for, a stop that never hangs the bench."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def running_server(
    argv: list[str],
    ready_url: str,
    *,
    env: Mapping[str, str] | None = None,
    quiet: bool = False,
    cwd: str | None = None,
) -> Iterator[int]:
    """Start `argv`, wait until `ready_url` answers 200 (at most 120 s), yield its pid; stop it on the way out
    (killed if it takes over 90 s)."""
    output = subprocess.DEVNULL if quiet else None
    server = subprocess.Popen(argv, env=env, stdout=output, stderr=output, cwd=cwd)
    try:
        deadline = time.monotonic() + 120
        while not _answers(ready_url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server ({' '.join(argv)}) did not start")
            time.sleep(0.2)
        yield server.pid
    finally:
        server.terminate()
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            print("  (the server took over 90 s to shut down; killed)")
            server.kill()
            server.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
