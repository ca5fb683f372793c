"""`/metadata` says which backend serves rollouts and, when it cannot, what to set; the server starts regardless."""

from __future__ import annotations

import httpx
import pytest

from opencode_env.sandbox.base import Preflight, SandboxBackend
from opencode_env.sandbox.cloud.e2b import E2BBackend
from opencode_env.wire import VERSION
from opencode_env.wire.answer import inline_result
from tests.server_app import app_for
from tests.stub_server import CountingBackend

NAMESPACES_PROBLEM = "this container cannot create user namespaces: set E2B_API_KEY"


class PreflightedBackend(CountingBackend):
    def __init__(self, problem: str | None) -> None:
        super().__init__(command_s=0.0)
        self.problem = problem

    def preflight_verdict(self) -> Preflight:
        return Preflight(self.problem, proven=True)


async def metadata(backend: SandboxBackend) -> dict[str, object]:
    transport = httpx.ASGITransport(app=app_for(backend, token=""), client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        assert (await client.get("/health")).status_code == 200
        answer: dict[str, object] = (await client.get("/metadata")).json()
        return answer


async def test_an_e2b_backend_without_a_key_is_reported_with_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    answer = await metadata(E2BBackend(api_key=""))
    assert (answer["version"], answer["backend"], answer["backend_usable"]) == (VERSION, "e2b", False)
    assert "set E2B_API_KEY" in str(answer["preflight"])


@pytest.mark.parametrize(("problem", "usable"), [(NAMESPACES_PROBLEM, False), (None, True)])
async def test_a_backends_own_preflight_verdict_is_shown(problem: str | None, usable: bool) -> None:
    answer = await metadata(PreflightedBackend(problem))
    assert (answer["backend"], answer["backend_usable"], answer["preflight"]) == ("stub", usable, problem)


async def test_a_backend_that_failed_its_preflight_answers_every_rollout_with_the_reason() -> None:
    backend = PreflightedBackend(NAMESPACES_PROBLEM)
    transport = httpx.ASGITransport(app=app_for(backend, token=""), client=("127.0.0.1", 40000))
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    call["params"] = {"name": "run_rollout", "arguments": {"instruction": "x", "task_id": "doomed"}}
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        answer = (await client.post("/mcp", json=call)).json()
    result = inline_result(answer["result"]["structured_content"])
    assert (result.status, result.failed_phase, result.error) == ("sandbox_error", "sandbox", NAMESPACES_PROBLEM)
    assert (result.reward, backend.created) == (None, 0)
