"""A server started on a backend name the registry does not know, as a real process: it exits naming the variable
and the known names, or (under uvicorn) says why on every route. The registry's own rules are in
tests/unit/test_backend_registry.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from opencode_env.server.staged import STARTING

ROOT = Path(__file__).resolve().parents[2]


KNOWN = ("auto", "local", "e2b", "hf")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.timeout(120)
def test_a_server_on_an_unknown_backend_name_exits_naming_the_variable_and_the_known_names() -> None:
    env = {**os.environ, "OPENCODE_ENV_BACKEND": "locl", "HOST": "127.0.0.1", "PORT": str(free_port())}
    ended = subprocess.run(
        [sys.executable, "-m", "opencode_env.server.app"],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert ended.returncode == 2
    assert "a setting is refused" in ended.stderr
    assert "OPENCODE_ENV_BACKEND" in ended.stderr
    assert "'locl'" in ended.stderr
    assert all(f"'{name}'" in ended.stderr for name in KNOWN)


@pytest.mark.timeout(120)
def test_uvicorn_serving_the_app_on_an_unknown_backend_name_says_why_on_every_route(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "OPENCODE_ENV_BACKEND": "locl"}
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "opencode_env.server.app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        answer = built_or_failed(url, 90)
        assert answer.status_code == 503, answer.text
        reason = answer.json()["error"]
        assert "OPENCODE_ENV_BACKEND" in reason
        assert "'locl'" in reason
        assert all(f"'{name}'" in reason for name in KNOWN)
        assert httpx.get(f"{url}/health").status_code == 503
        assert httpx.get(f"{url}/ready").status_code == 503
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def built_or_failed(url: str, within_s: float) -> httpx.Response:
    """/metadata once the server is built (200) or has failed to start (503 with its reason)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            answer = httpx.get(f"{url}/metadata", timeout=2)
            if answer.status_code == 200 or answer.json().get("error") != STARTING or time.monotonic() > deadline:
                return answer
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)
