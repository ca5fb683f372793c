"""The backend registry: a name it does not know is refused with the known ones (never taken for another backend);
what the server asks of a built backend (its default concurrency, what stops it here) the backend answers itself,
and what the command line asks before one is built (what it needs, whether it can be reaped) the registry does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import httpx
import pytest
from huggingface_hub import constants
from pydantic import ValidationError

from opencode_env.cli import build_parser
from opencode_env.sandbox import (
    AUTO,
    BACKENDS,
    EMBEDDED,
    BackendName,
    UnknownBackend,
    backend_names,
    default_backend,
    make_backend,
    reapable_names,
    resolve_backend_name,
)
from opencode_env.server.staged import STARTING
from opencode_env.settings import Settings
from opencode_env.testing.stub_backend import StubBackend
from tests.server_app import runtime_for

ROOT = Path(__file__).resolve().parents[2]
KNOWN = ("auto", "local", "e2b", "hf")
PER_CPU = max(2, (os.cpu_count() or 2) * 2)


@pytest.mark.parametrize("call", [make_backend, resolve_backend_name])
def test_an_unknown_backend_name_is_refused_with_the_known_ones(call: Callable[[str, Settings], object]) -> None:
    with pytest.raises(UnknownBackend) as refused:
        call("locl", Settings())
    assert "'locl'" in str(refused.value)
    assert all(name in str(refused.value) for name in KNOWN)


def test_the_registry_holds_every_name_the_type_allows() -> None:
    assert {AUTO, *backend_names()} == set(get_args(BackendName)) == set(KNOWN)


@pytest.mark.parametrize("name", ["local", "e2b", "hf"])
def test_each_registered_name_builds_its_own_backend(name: str) -> None:
    assert make_backend(name).name == name


def test_a_caller_that_names_no_backend_gets_the_embedded_one() -> None:
    assert default_backend().name == EMBEDDED == "local"


@pytest.mark.parametrize(("name", "expected"), [("local", PER_CPU), ("e2b", 16), ("hf", PER_CPU)])
def test_the_server_caps_rollouts_at_the_backends_own_default(
    name: str, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MAX_CONCURRENT_ENVS", raising=False)
    monkeypatch.delenv("OPENCODE_ENV_BACKEND", raising=False)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    backend = make_backend(name)
    assert backend.capabilities.default_concurrency == expected
    assert runtime_for(backend).rollouts.limit == expected
    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "3")
    assert runtime_for(backend).rollouts.limit == 3


def test_a_backend_outside_the_registry_gets_its_own_default() -> None:
    assert runtime_for(StubBackend()).rollouts.limit == StubBackend.capabilities.default_concurrency == PER_CPU


def test_what_stops_each_backend_here_is_answered_by_the_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    # Gone (CHANGELOG): it must not hide a missing bubblewrap.
    monkeypatch.setenv("OPENCODE_ENV_LOCAL_ISOLATION", "none")
    for variable in ("E2B_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    verdicts = {name: make_backend(name).preflight_verdict() for name in backend_names()}
    assert not any(verdict.proven for verdict in verdicts.values())
    assert "bubblewrap" in str(verdicts["local"].problem)
    assert "set E2B_API_KEY" in str(verdicts["e2b"].problem)
    assert "set HF_TOKEN" in str(verdicts["hf"].problem)
    keys = Settings.load({"E2B_API_KEY": "e2b-key", "HF_TOKEN": "hf-token"})
    assert [make_backend(name, keys).preflight_verdict().problem for name in ("e2b", "hf")] == [None, None]
    monkeypatch.setenv("E2B_API_KEY", "e2b-key")
    monkeypatch.setenv("HF_TOKEN", "hf-token")
    assert [make_backend(name).preflight_verdict().problem for name in ("e2b", "hf")] == [None, None]


def test_only_the_local_backend_enforces_a_rollouts_limits() -> None:
    assert [name for name in BACKENDS if make_backend(name).capabilities.enforces_limits] == ["local"]


def test_the_command_line_offers_the_registered_backends(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for name in backend_names():
        assert parser.parse_args(["run", "--backend", name, "--instruction", "x"]).backend == name
        assert parser.parse_args(["serve", "--backend", name]).backend == name
        if name not in reapable_names():
            with pytest.raises(SystemExit):
                parser.parse_args(["reap", "--backend", name])
    assert parser.parse_args(["serve"]).backend == AUTO
    assert parser.parse_args(["reap"]).backend in reapable_names()
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--backend", "locl", "--instruction", "x"])
    assert "'locl'" in capsys.readouterr().err


def test_the_servers_settings_refuse_an_unknown_backend_name_naming_the_variable() -> None:
    with pytest.raises(ValidationError, match="OPENCODE_ENV_BACKEND"):
        Settings.load({"OPENCODE_ENV_BACKEND": "locl"})


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
