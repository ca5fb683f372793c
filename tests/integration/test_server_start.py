"""A server whose port is taken says so before anything says it is ready, and exits 2; the admin calls to a
rollout's proxy (a poll every second per rollout) are out of the server's INFO log."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest

import opencode_env.sandbox.local.proxy  # noqa: F401  (installs the filter on httpx's logger)


def test_a_taken_port_is_reported_before_ready() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        ran = subprocess.run(
            [sys.executable, "-m", "opencode_env.cli", "serve", "--backend", "local", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert ran.returncode == 2
    assert f"opencode-env serve: cannot listen on 127.0.0.1:{port}: Address already in use" in ran.stderr
    assert "ready" not in ran.stderr.replace("already", "")
    assert "Traceback" not in ran.stderr


def test_proxy_admin_calls_are_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    httpx_log = logging.getLogger("httpx")
    with caplog.at_level(logging.INFO, logger="httpx"):
        httpx_log.info('HTTP Request: GET http://proxy/healthz "HTTP/1.1 200 OK"')
        httpx_log.info('HTTP Request: POST https://api.e2b.dev/sandboxes "HTTP/1.1 201 Created"')
    assert [record.getMessage() for record in caplog.records] == [
        'HTTP Request: POST https://api.e2b.dev/sandboxes "HTTP/1.1 201 Created"'
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="httpx"):
        httpx_log.info('HTTP Request: GET http://proxy/healthz "HTTP/1.1 200 OK"')
    assert len(caplog.records) == 1
