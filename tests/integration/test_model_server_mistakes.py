"""Pointing at the wrong server, or the right server with the wrong name, speaks at once: the scripted model
answers a model it does not serve with vLLM's 404 (so the probe refuses the rollout naming the served one), and
OpenCodeEnv pointed at a model server says it is one."""

from __future__ import annotations

import httpx
import pytest

from opencode_env import OpenCodeEnv
from opencode_env.rollout.pipeline import run_rollout
from opencode_env.rollout.preflight.probe import forget_probes
from opencode_env.scripted.demo import demo_request
from opencode_env.scripted.model import ScriptedModelServer
from opencode_env.scripted.script import demo_script
from opencode_env.testing.stub_backend import StubBackend


def test_the_scripted_model_answers_a_model_it_does_not_serve_as_vllm_does() -> None:
    with ScriptedModelServer(demo_script()) as model:
        body = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}]}
        wrong = httpx.post(f"{model.base_url}/chat/completions", json=body, timeout=30)
        right = httpx.post(f"{model.base_url}/chat/completions", json={**body, "model": "scripted-policy"}, timeout=30)
    assert wrong.status_code == 404
    assert wrong.json()["error"] == {
        "message": "The model `Qwen/Qwen3-8B` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert right.status_code == 200


async def test_a_rollout_naming_a_model_the_scripted_model_does_not_serve_is_refused_before_any_sandbox() -> None:
    forget_probes()
    backend = StubBackend(command_s=0.01)
    with ScriptedModelServer(demo_script()) as model:
        result = await run_rollout(demo_request(model.base_url, model="scripted-polcy"), backend)
    assert (result.status, result.failed_phase) == ("invalid_request", "validate")
    assert "scripted-policy" in (result.error or "")
    assert (result.sandbox_id, backend.alive) == ("", set())
    assert result.warnings == []  # refused before sampling: no sampling warning


@pytest.mark.parametrize("path", ["/v1", ""])
def test_the_client_pointed_at_a_model_server_says_it_is_one(path: str) -> None:
    with ScriptedModelServer(demo_script()) as model:
        url = model.base_url.removesuffix("/v1") + path
        with pytest.raises(ConnectionError) as refused, OpenCodeEnv(base_url=url):
            pass
    message = str(refused.value)
    assert f"{url} is a model server" in message
    assert "lists scripted-policy" in message
    assert "not an opencode-env server" in message
