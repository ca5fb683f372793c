"""A model endpoint that cannot serve the rollout is refused before any sandbox, with its cause and its fix.

Each case is a real server on loopback (or a closed port): a plain-HTTP server asked for TLS, servers that answer
401 and vLLM's 404 for a model they do not serve, the scripted model under a base URL without /v1. How fast the
refusals come is `bench/endpoint_errors.py`'s figure, not an assertion here.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import forget_probes
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.scripted.threaded_server import ThreadedServer
from opencode_env.settings import Settings
from opencode_env.testing.stub_backend import StubBackend
from opencode_env.wire import RolloutResult
from tests.upstream_servers import PrivateCA, served

SERVED = ["Qwen/Qwen3-8B", "Qwen/Qwen3-8B-lora-a"]


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    forget_probes()
    yield
    forget_probes()


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released (the kernel hands it out again only later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def vllm_like(key: str) -> Starlette:
    """vLLM's answers to a wrong key (401) and to a model it does not serve (404), and its /v1/models."""

    def refused(request: Request) -> JSONResponse | None:
        if key and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return None

    async def models(request: Request) -> JSONResponse:
        return refused(request) or JSONResponse({"object": "list", "data": [{"id": name} for name in SERVED]})

    async def chat(request: Request) -> JSONResponse:
        model = (await request.json()).get("model")
        error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}
        return refused(request) or JSONResponse({"error": error}, status_code=404)

    return Starlette(
        routes=[Route("/v1/models", models, methods=["GET"]), Route("/v1/chat/completions", chat, methods=["POST"])]
    )


@pytest.fixture
def model_server() -> Iterator[str]:
    server = ThreadedServer(vllm_like(key="sk-right"))
    server.start()
    try:
        yield f"{server.url}/v1"
    finally:
        server.stop()


async def refused_before_any_sandbox(base_url: str, **fields: object) -> RolloutResult:
    backend = StubBackend()
    result = await run_rollout(demo_request(base_url, endpoint="", **fields), backend)
    assert result.failed_phase == "validate", result.error
    assert result.sandbox_id == ""
    assert backend.alive == set()
    return result


async def test_a_closed_port_is_refused_naming_the_url_and_how_to_start_a_server() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    result = await refused_before_any_sandbox(url)
    assert result.status == "upstream_error"
    assert result.reward is None
    error = result.error or ""
    assert url in error
    assert "refused the connection" in error
    assert "vllm serve" in error
    assert "capture='text'" not in error


async def test_a_host_name_that_does_not_resolve_is_named() -> None:
    result = await refused_before_any_sandbox("http://model-host.invalid:8000/v1")
    assert result.status == "upstream_error"
    assert "'model-host.invalid'" in (result.error or "")
    assert "does not resolve" in (result.error or "")


async def test_https_to_a_plain_http_server_says_http(model_server: str) -> None:
    result = await refused_before_any_sandbox(model_server.replace("http://", "https://"))
    assert result.status == "upstream_error"
    assert "TLS" in (result.error or "")
    assert "takes http://" in (result.error or "")


async def test_a_certificate_the_probe_cannot_verify_is_a_warning_not_a_refusal(tmp_path: Path) -> None:
    """The probe trusts its own CA bundle, the proxy the system's (a private CA there may well be trusted)."""
    backend = StubBackend()
    with served("uvicorn-h11", PrivateCA(tmp_path)) as url:
        result = await run_rollout(demo_request(url, endpoint=""), backend)
    assert result.failed_phase != "validate", result.error
    assert result.sandbox_id.startswith("stub")
    assert any(
        "capture not checked" in warning and "CERTIFICATE_VERIFY_FAILED" in warning for warning in result.warnings
    )


async def test_a_wrong_key_is_refused_naming_where_the_key_comes_from(model_server: str) -> None:
    result = await refused_before_any_sandbox(model_server, api_key="sk-wrong", model=SERVED[0])
    assert result.status == "invalid_request"
    error = result.error or ""
    assert "refused the key" in error
    assert "HTTP 401" in error
    assert "--api-key-env" in error
    assert "sk-wrong" not in result.model_dump_json()


async def test_a_missing_key_from_the_servers_settings_names_the_variable(model_server: str) -> None:
    backend = StubBackend()
    request = demo_request("", endpoint="vllm", model=SERVED[0], api_key="")
    settings = Settings.model_validate({"VLLM_URL": model_server, "VLLM_API_KEY": "sk-stale"})
    result = await run_rollout(request, backend, settings=settings)
    assert (result.status, result.failed_phase, result.sandbox_id) == ("invalid_request", "validate", "")
    assert "the server's VLLM_API_KEY" in (result.error or "")


async def test_a_model_the_server_does_not_serve_lists_what_it_serves(model_server: str) -> None:
    result = await refused_before_any_sandbox(model_server, api_key="sk-right", model="Qwen/Qwen3-8b")
    assert result.status == "invalid_request"
    error = result.error or ""
    assert "does not serve model 'Qwen/Qwen3-8b'" in error
    assert all(repr(name) in error for name in SERVED)
    assert "--model" in error
    assert "capture='text'" not in error


async def test_a_base_url_without_v1_says_what_a_base_url_is() -> None:
    with ScriptedModelServer(demo_script()) as model:
        result = await refused_before_any_sandbox(model.base_url.removesuffix("/v1"))
        assert model.exchanges == []
    assert result.status == "invalid_request"
    assert "not an OpenAI-compatible API" in (result.error or "")
    assert "http://HOST:PORT/v1" in (result.error or "")


def test_the_command_line_prints_the_cause_and_takes_capture() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    command = [sys.executable, "-m", "opencode_env.cli", "run", "--instruction", "go"]
    command += ["--verify", "true", "--base-url", url, "--model", "m", "--capture", "text"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 1, completed.stderr
    result = json.loads(completed.stdout)
    assert result["task"]["capture"] == "text"
    assert f"opencode-env run: the model server at {url} refused the connection" in completed.stderr
